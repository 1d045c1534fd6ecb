package idempotency

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The middleware over real HTTP (httptest servers on loopback) and a real database, on the
// standard mux and on chi. The test handler writes a row of go_test_charges per charge and
// obeys X-Test-* request headers.

type testApp struct {
	pool  *pgxpool.Pool
	cause chan error // the handler's context's cause when X-Test-Wait-Cancel is set
}

func (a *testApp) handler(w http.ResponseWriter, r *http.Request) {
	h := FromRequest(r)
	var req struct{ Amount int64 }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		(&Problem{Status: 400, Title: "Invalid request", Detail: "amount"}).WriteTo(w)
		return
	}
	if ms, _ := strconv.Atoi(r.Header.Get("X-Test-Sleep-Ms")); ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	if r.Header.Get("X-Test-Wait-Cancel") != "" {
		select {
		case <-r.Context().Done():
			a.cause <- context.Cause(r.Context())
		case <-time.After(10 * time.Second):
			a.cause <- errors.New("not cancelled")
		}
		// A handler that reports success all the same: the middleware must not.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"by":"the stalled attempt"}`))
		return
	}
	switch r.Header.Get("X-Test-Answer") {
	case "500":
		if r.Header.Get("X-Test-Keep") != "" {
			h.Keep()
		}
		(&Problem{Status: 500, Title: "Failed", Detail: "injected"}).WriteTo(w)
		return
	case "422":
		(&Problem{Status: 422, Title: "Invalid charge", Detail: "a validation error of the handler's own"}).WriteTo(w)
		return
	case "panic":
		panic("injected")
	case "text":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintf(w, "charged %d <&> \u00e9 at %d\n", req.Amount, time.Now().UnixNano())
		return
	}
	ctx := r.Context()
	insert := `INSERT INTO go_test_charges (scope, amount) VALUES ($1, $2) RETURNING id`
	var id int64
	var err error
	if h == nil { // an optional key that was not sent
		err = a.pool.QueryRow(ctx, insert, "unprotected", req.Amount).Scan(&id)
	} else if tx := h.Tx(); tx != nil {
		err = tx.QueryRow(ctx, insert, h.Scope, req.Amount).Scan(&id)
	} else {
		err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, insert, h.Scope, req.Amount).Scan(&id); err != nil {
				return err
			}
			return h.Checkpoint(ctx, tx, "charged", map[string]int64{"id": id})
		})
	}
	if err != nil {
		(&Problem{Status: 500, Title: "Failed", Detail: err.Error()}).WriteTo(w)
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%d,  "amount":%d, "at": %d}`, id, req.Amount, time.Now().UnixNano())
}

func tenantOf(r *http.Request) (string, error) {
	if t := r.Header.Get("X-Api-Key"); t != "" {
		return t, nil
	}
	return "", &Problem{Status: 401, Title: "Unauthorized", Detail: "X-Api-Key",
		Headers: map[string]string{"WWW-Authenticate": "ApiKey"}}
}

var routers = []string{"std", "chi"}

// serve starts the app on a router with the two routes (/charges same transaction,
// /charges/external committed first) and, on chi, /accounts/{acct}/charges.
func serve(t *testing.T, pool *pgxpool.Pool, router string, same, external Policy) (*httptest.Server, *testApp) {
	t.Helper()
	app := &testApp{pool: pool, cause: make(chan error, 1)}
	opts := Options{Tenant: tenantOf}
	if router == "chi" {
		opts.Route = func(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() }
	}
	m := New(pool, opts)
	h := http.HandlerFunc(app.handler)
	var root http.Handler
	if router == "chi" {
		r := chi.NewRouter()
		r.With(m.Protect(same)).Post("/charges", h)
		r.With(m.Protect(external)).Post("/charges/external", h)
		r.With(m.Protect(same)).Post("/accounts/{acct}/charges", h)
		root = r
	} else {
		mux := http.NewServeMux()
		mux.Handle("POST /charges", m.Protect(same)(h))
		mux.Handle("POST /charges/external", m.Protect(external)(h))
		root = mux
	}
	srv := httptest.NewServer(root)
	t.Cleanup(srv.Close)
	return srv, app
}

func defaultServer(t *testing.T, router string) (*httptest.Server, *testApp) {
	return serve(t, testPool(t), router, Policy{}, Policy{Mode: CommittedFirst, Lease: 3 * time.Second})
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

func (r resp) String() string { return fmt.Sprintf("%d %v %s", r.status, r.header, r.body) }

// post sends body with the given header lines ("Name: value"; a name may repeat).
func post(t *testing.T, url, body string, lines ...string) resp {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, line := range lines {
		name, value, _ := strings.Cut(line, ": ")
		req.Header.Add(name, value)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return resp{}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, b}
}

// isProblem: status, problem+json, and the contract's type when slug is given.
func isProblem(r resp, status int, slug string) bool {
	var p struct {
		Type, Title, Detail string
		Status              int
	}
	if r.status != status || r.header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(r.body, &p) != nil || p.Status != status || p.Title == "" || p.Detail == "" {
		return false
	}
	return slug == "" || p.Type == ProblemTypePrefix+slug
}

func key(k string) string { return "Idempotency-Key: " + strconv.Quote(k) }

func TestHTTPKeyAndTenant(t *testing.T) {
	for _, router := range routers {
		t.Run(router, func(t *testing.T) {
			srv, _ := defaultServer(t, router)
			tenant := uniqueName(t)
			url := srv.URL + "/charges"
			cases := []struct {
				name  string
				lines []string
				slug  string
			}{
				{"missing", nil, slugKeyMissing},
				{"a bare value with a space", []string{"Idempotency-Key: a b"}, slugKeyInvalid},
				{"empty", []string{`Idempotency-Key: ""`}, slugKeyInvalid},
				{"256 characters", []string{key(strings.Repeat("k", 256))}, slugKeyInvalid},
				{"parameters", []string{`Idempotency-Key: "k";p=1`}, slugKeyInvalid},
				{"two field lines", []string{key("a"), key("b")}, slugKeyInvalid},
			}
			for _, c := range cases {
				r := post(t, url, `{"amount": 5}`, append(c.lines, "X-Api-Key: "+tenant)...)
				if !isProblem(r, 400, c.slug) {
					t.Errorf("key %s: %v; want a 400 %s problem", c.name, r, c.slug)
				}
			}
			r := post(t, url, `{"amount": 5}`, key("k"))
			if !isProblem(r, 401, "") || r.header.Get("WWW-Authenticate") != "ApiKey" {
				t.Errorf("no tenant: %v; want the tenant function's 401", r)
			}
			if n := countRows(t, testPool(t), `SELECT count(*) FROM idempotency.keys WHERE scope LIKE $1 || '%'`, tenant); n != 0 {
				t.Errorf("%d records after refused requests; want none", n)
			}
		})
	}
}

func TestHTTPReplayAndMismatch(t *testing.T) {
	for _, router := range routers {
		for _, route := range []string{"/charges", "/charges/external"} {
			t.Run(router+route, func(t *testing.T) {
				srv, _ := defaultServer(t, router)
				pool := testPool(t)
				tenant, k := uniqueName(t), NewToken()
				first := post(t, srv.URL+route, `{"amount": 500}`, key(k), "X-Api-Key: "+tenant)
				if first.status != 201 || first.replayed() || !json.Valid(first.body) {
					t.Fatalf("first: %v", first)
				}
				again := post(t, srv.URL+route, `{ "amount" : 500.0 }`, key(k), "X-Api-Key: "+tenant)
				if again.status != 201 || !again.replayed() || !bytes.Equal(again.body, first.body) ||
					again.header.Get("Location") != first.header.Get("Location") ||
					again.header.Get("Content-Type") != "application/json" {
					t.Errorf("retry (the same JSON written differently): %v; want the first answer replayed, byte for byte (%s)",
						again, first.body)
				}
				other := post(t, srv.URL+route, `{"amount": 501}`, key(k), "X-Api-Key: "+tenant)
				if !isProblem(other, 422, slugReused) {
					t.Errorf("another body: %v; want 422", other)
				}
				scope := tenant + ":POST " + route
				if n := countRows(t, pool, `SELECT count(*) FROM go_test_charges WHERE scope = $1`, scope); n != 1 {
					t.Errorf("%d charge rows in scope %q; want 1", n, scope)
				}
				if rec, err := Lookup(testCtx, pool, scope, k); err != nil || rec == nil || rec.Status != "completed" {
					t.Errorf("record: %+v, %v", rec, err)
				}
			})
		}
	}
}

func TestHTTPChiRouteTemplateScope(t *testing.T) {
	srv, _ := defaultServer(t, "chi")
	tenant, k := uniqueName(t), NewToken()
	r := post(t, srv.URL+"/accounts/a-1/charges", `{"amount": 7}`, key(k), "X-Api-Key: "+tenant)
	if r.status != 201 {
		t.Fatalf("%v", r)
	}
	scope := tenant + ":POST /accounts/{acct}/charges"
	if rec, err := Lookup(testCtx, testPool(t), scope, k); err != nil || rec == nil {
		t.Errorf("no record in scope %q (the route template): %+v, %v", scope, rec, err)
	}
}

func TestHTTPConcurrentDuplicates(t *testing.T) {
	for _, route := range []string{"/charges", "/charges/external"} {
		t.Run(route, func(t *testing.T) {
			srv, _ := defaultServer(t, "std")
			tenant, k, n := uniqueName(t), NewToken(), 12
			answers := make([]resp, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					answers[i] = post(t, srv.URL+route, `{"amount": 3}`, key(k), "X-Api-Key: "+tenant,
						"X-Test-Sleep-Ms: 200")
				}()
			}
			close(start)
			wg.Wait()
			var firsts, replays, conflicts int
			for _, a := range answers {
				switch {
				case a.status == 201 && !a.replayed():
					firsts++
				case a.status == 201:
					replays++
				case isProblem(a, 409, slugInProgress) && a.header.Get("Retry-After") != "":
					conflicts++
				default:
					t.Errorf("unexpected answer %v", a)
				}
			}
			if firsts != 1 || replays+conflicts != n-1 {
				t.Errorf("%d firsts, %d replays, %d 409s; want one first", firsts, replays, conflicts)
			}
			scope := tenant + ":POST " + route
			if c := countRows(t, testPool(t), `SELECT count(*) FROM go_test_charges WHERE scope = $1`, scope); c != 1 {
				t.Errorf("%d charge rows; want 1", c)
			}
		})
	}
}

func TestHTTPInProgressWhileLeaseRenewed(t *testing.T) {
	pool := testPool(t)
	srv, _ := serve(t, pool, "std", Policy{}, Policy{Mode: CommittedFirst, Lease: 900 * time.Millisecond})
	tenant, k := uniqueName(t), NewToken()
	scope, url := tenant+":POST /charges/external", srv.URL+"/charges/external"
	done := make(chan resp, 1)
	go func() { done <- post(t, url, `{"amount": 9}`, key(k), "X-Api-Key: "+tenant, "X-Test-Sleep-Ms: 2000") }()
	waitFor(t, "the claim", func() bool { rec, _ := Lookup(testCtx, pool, scope, k); return rec != nil })
	dup := post(t, url, `{"amount": 9}`, key(k), "X-Api-Key: "+tenant)
	if !isProblem(dup, 409, slugInProgress) || dup.header.Get("Retry-After") != "1" {
		t.Errorf("a duplicate: %v; want 409 with Retry-After 1 (the lease's seconds left)", dup)
	}
	time.Sleep(1200 * time.Millisecond) // past the first lease: renewed meanwhile
	late := post(t, url, `{"amount": 9}`, key(k), "X-Api-Key: "+tenant)
	if !isProblem(late, 409, slugInProgress) {
		t.Errorf("past the first lease: %v; want 409 (the lease was renewed)", late)
	}
	first := <-done
	again := post(t, url, `{"amount": 9}`, key(k), "X-Api-Key: "+tenant)
	if first.status != 201 || !again.replayed() || !bytes.Equal(again.body, first.body) {
		t.Errorf("first %v, then %v; want 201 then its replay", first, again)
	}
	if rec, _ := Lookup(testCtx, pool, scope, k); rec == nil || rec.Attempts != 1 {
		t.Errorf("record %+v: want one attempt (never taken over)", rec)
	}
}

func TestHTTPLockTimeoutIs409(t *testing.T) {
	pool := testPool(t)
	srv, _ := serve(t, pool, "std", Policy{LockTimeout: 200 * time.Millisecond}, Policy{Mode: CommittedFirst})
	tenant, k := uniqueName(t), NewToken()
	done := make(chan resp, 1)
	go func() {
		done <- post(t, srv.URL+"/charges", `{"amount": 4}`, key(k), "X-Api-Key: "+tenant, "X-Test-Sleep-Ms: 1500")
	}()
	time.Sleep(300 * time.Millisecond)
	dup := post(t, srv.URL+"/charges", `{"amount": 4}`, key(k), "X-Api-Key: "+tenant)
	if !isProblem(dup, 409, slugInProgress) || dup.header.Get("Retry-After") != "1" {
		t.Errorf("a duplicate behind the open transaction: %v; want 409 after lock_timeout", dup)
	}
	if first := <-done; first.status != 201 {
		t.Errorf("first: %v", first)
	}
}

// Answers that mean "not carried out" give the key back; the same key then runs as new.
func TestHTTPNotCarriedOutLeavesKeyFree(t *testing.T) {
	for _, route := range []string{"/charges", "/charges/external"} {
		for _, c := range []struct {
			name, body string
			lines      []string
			status     int
		}{
			{"a body the handler refuses", `{"amount": "lots"`, nil, 400},
			{"a validation error (422)", `{"amount": 2}`, []string{"X-Test-Answer: 422"}, 422},
			{"a 5xx answer", `{"amount": 2}`, []string{"X-Test-Answer: 500"}, 500},
			{"a panic", `{"amount": 2}`, []string{"X-Test-Answer: panic"}, 500},
		} {
			t.Run(route+" "+c.name, func(t *testing.T) {
				srv, _ := defaultServer(t, "std")
				tenant, k := uniqueName(t), NewToken()
				r := post(t, srv.URL+route, c.body, append(c.lines, key(k), "X-Api-Key: "+tenant)...)
				if !isProblem(r, c.status, "") {
					t.Errorf("%v; want a %d problem", r, c.status)
				}
				if rec, err := Lookup(testCtx, testPool(t), tenant+":POST "+route, k); rec != nil || err != nil {
					t.Errorf("a record is left: %+v, %v", rec, err)
				}
				again := post(t, srv.URL+route, `{"amount": 2}`, key(k), "X-Api-Key: "+tenant)
				if again.status != 201 || again.replayed() {
					t.Errorf("the same key then: %v; want 201, run as new", again)
				}
			})
		}
	}
}

func TestHTTPServerErrorsStoredOrKept(t *testing.T) {
	pool := testPool(t)
	srv, _ := serve(t, pool, "std", Policy{StoreServerErrors: true}, Policy{Mode: CommittedFirst, Lease: 5 * time.Second})
	tenant, k := uniqueName(t), NewToken()
	first := post(t, srv.URL+"/charges", `{"amount": 1}`, key(k), "X-Api-Key: "+tenant, "X-Test-Answer: 500")
	again := post(t, srv.URL+"/charges", `{"amount": 1}`, key(k), "X-Api-Key: "+tenant)
	if first.status != 500 || !again.replayed() || again.status != 500 || !bytes.Equal(again.body, first.body) {
		t.Errorf("StoreServerErrors: %v then %v; want the 500 replayed", first, again)
	}
	kept := post(t, srv.URL+"/charges/external", `{"amount": 1}`, key(k), "X-Api-Key: "+tenant,
		"X-Test-Answer: 500", "X-Test-Keep: 1")
	rec, err := Lookup(testCtx, pool, tenant+":POST /charges/external", k)
	if kept.status != 500 || err != nil || rec == nil || rec.Status != "in_progress" {
		t.Errorf("Keep: %v, record %+v, %v; want the claim left in progress", kept, rec, err)
	}
}

func TestHTTPTextBodyReplayed(t *testing.T) {
	srv, _ := defaultServer(t, "std")
	tenant, k := uniqueName(t), NewToken()
	first := post(t, srv.URL+"/charges", `{"amount": 1}`, key(k), "X-Api-Key: "+tenant, "X-Test-Answer: text")
	again := post(t, srv.URL+"/charges", `{"amount": 1}`, key(k), "X-Api-Key: "+tenant, "X-Test-Answer: text")
	if first.status != 200 || !again.replayed() || !bytes.Equal(again.body, first.body) ||
		again.header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("text body: %v then %v; want the same bytes replayed", first, again)
	}
}

func TestHTTPOptionalKeyAndIgnoredFields(t *testing.T) {
	pool := testPool(t)
	srv, _ := serve(t, pool, "std", Policy{Optional: true, IgnoreFields: []string{"nonce"}}, Policy{Mode: CommittedFirst})
	tenant, k := uniqueName(t), NewToken()
	if r := post(t, srv.URL+"/charges", `{"amount": 1}`, "X-Api-Key: "+tenant); r.status != 201 {
		t.Errorf("no key on an optional route: %v; want it run unprotected", r)
	}
	first := post(t, srv.URL+"/charges", `{"amount": 1, "nonce": "a"}`, key(k), "X-Api-Key: "+tenant)
	again := post(t, srv.URL+"/charges", `{"amount": 1, "nonce": "b"}`, key(k), "X-Api-Key: "+tenant)
	if first.status != 201 || !again.replayed() {
		t.Errorf("bodies differing in an ignored field: %v then %v; want a replay", first, again)
	}
}

// A committed-first claim taken over while its handler runs: the renewal notices and cancels
// the handler's context; the late completion is fenced and answered 409, never as success.
func TestHTTPLateCompletionFenced(t *testing.T) {
	pool := testPool(t)
	srv, app := serve(t, pool, "std", Policy{}, Policy{Mode: CommittedFirst, Lease: 900 * time.Millisecond})
	tenant, k := uniqueName(t), NewToken()
	scope, url := tenant+":POST /charges/external", srv.URL+"/charges/external"
	done := make(chan resp, 1)
	go func() { done <- post(t, url, `{"amount": 8}`, key(k), "X-Api-Key: "+tenant, "X-Test-Wait-Cancel: 1") }()
	waitFor(t, "the claim", func() bool { rec, _ := Lookup(testCtx, pool, scope, k); return rec != nil })
	// A stall, as seen from the database: the lease ends; another attempt takes the key over.
	mustExec(t, pool, `UPDATE idempotency.keys SET locked_until = now() - interval '1 second'
		WHERE scope = $1 AND key = $2`, scope, k)
	taker, err := ClaimKey(testCtx, pool, scope, k, ClaimOptions{JSON: []byte(`{"amount": 8}`), Lease: time.Minute})
	if err != nil || taker.Outcome != Reclaimed {
		t.Fatalf("takeover: %+v, %v", taker, err)
	}
	if _, err := Complete(testCtx, pool, scope, k, taker.Token, 201, []byte(`{"by":"taker"}`), nil); err != nil {
		t.Fatal(err)
	}
	if cause := <-app.cause; !errors.Is(cause, ErrNotOwner) {
		t.Errorf("the handler's context: cause %v; want ErrNotOwner", cause)
	}
	late := <-done
	if !isProblem(late, 409, slugSuperseded) {
		t.Errorf("the stalled attempt's answer: %v; want 409 superseded", late)
	}
	again := post(t, url, `{"amount": 8}`, key(k), "X-Api-Key: "+tenant)
	if !again.replayed() || string(again.body) != `{"by": "taker"}` {
		t.Errorf("a retry: %v; want the takeover's answer", again)
	}
}

func TestHTTPDatabaseUnavailable(t *testing.T) {
	pool, err := pgxpool.New(testCtx, "postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	srv, _ := serve(t, pool, "std", Policy{}, Policy{Mode: CommittedFirst})
	for _, route := range []string{"/charges", "/charges/external"} {
		r := post(t, srv.URL+route, `{"amount": 1}`, key("k"), "X-Api-Key: t")
		if !isProblem(r, 503, slugUnavailable) || r.header.Get("Retry-After") == "" {
			t.Errorf("%s with the database down: %v; want a 503 problem with Retry-After", route, r)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// rawPost sends a POST /charges whose Idempotency-Key field value is exactly value (bytes that
// net/http's client refuses to send), and reads the answer.
func rawPost(t *testing.T, srv *httptest.Server, tenant, value string) resp {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"amount": 5}`
	_, err = fmt.Fprintf(conn, "POST /charges HTTP/1.1\r\nHost: test\r\nX-Api-Key: %s\r\nIdempotency-Key: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", tenant, value, len(body), body)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("key %q: %v", value, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, b}
}

// The key's characters over real HTTP, where net/http's server reads the header before the
// middleware: an sf-string may hold spaces (a key like any other); a tab between the quotes or
// a byte outside ASCII reaches the middleware and gets its 400 problem; every other control
// character (and DEL) is refused by net/http itself, with its own plain-text 400, before any
// handler runs. Either way nothing is claimed.
func TestHTTPKeyCharacters(t *testing.T) {
	srv, _ := defaultServer(t, "std")
	tenant := uniqueName(t)
	r := post(t, srv.URL+"/charges", `{"amount": 5}`, `Idempotency-Key: "order 1001"`, "X-Api-Key: "+tenant)
	if r.status != 201 {
		t.Errorf(`an sf-string with a space, "order 1001": %v; want 201`, r)
	}
	if rec, err := Lookup(testCtx, testPool(t), tenant+":POST /charges", "order 1001"); err != nil || rec == nil {
		t.Errorf(`no record for the key "order 1001": %+v, %v`, rec, err)
	}
	for _, value := range []string{"\"a\tb\"", "\"caf\u00e9\"", "caf\u00e9"} {
		if r := rawPost(t, srv, tenant, value); !isProblem(r, 400, slugKeyInvalid) {
			t.Errorf("key %q: %v; want the middleware's 400 problem", value, r)
		}
	}
	for c := byte(0); c < 0x80; c++ {
		if c >= 0x20 && c != 0x7f || c == '\t' || c == '\r' || c == '\n' { // CR and LF end the field line
			continue
		}
		value := `"a` + string([]byte{c}) + `b"`
		r := rawPost(t, srv, tenant, value)
		if r.status != 400 || r.header.Get("Content-Type") == "application/problem+json" {
			t.Errorf("key %q: %v; want net/http's own 400", value, r)
		}
	}
	if n := countRows(t, testPool(t), `SELECT count(*) FROM idempotency.keys WHERE scope LIKE $1 || '%'`, tenant); n != 1 {
		t.Errorf("%d records; want 1 (the key with a space)", n)
	}
}
