package idempotency

// The sender against the real extension and a real HTTP receiver (an httptest server that
// answers from a script and logs every request's Idempotency-Key and body).

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

type reply struct {
	status  int
	headers map[string]string
}

type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	script []reply // used in turn; the last one repeats
	keys   []string
	bodies []string
}

func newReceiver(t *testing.T, script ...reply) *receiver {
	r := &receiver{script: script}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.keys = append(r.keys, req.Header.Get("Idempotency-Key"))
		r.bodies = append(r.bodies, string(body))
		answer := r.script[min(len(r.keys), len(r.script))-1]
		r.mu.Unlock()
		for k, v := range answer.headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(answer.status)
		_, _ = w.Write([]byte(`{"ok": true}`))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) seen() ([]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...), append([]string(nil), r.bodies...)
}

// prepared commits one send of target and returns it.
func prepared(t *testing.T, scope, operation, target string, request any) Prepared {
	t.Helper()
	var p Prepared
	err := pgx.BeginFunc(testCtx, testPool(t), func(tx pgx.Tx) (err error) {
		p, err = Prepare(testCtx, tx, scope, operation, target, request, PrepareOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("prepare %s: %v", operation, err)
	}
	return p
}

func newTestSender(t *testing.T, o SenderOptions) *Sender {
	t.Helper()
	if o.Lease == 0 {
		o.Lease, o.Timeout = 5*time.Second, 2*time.Second
	}
	s, err := NewSender(testPool(t), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSenderPrepare(t *testing.T) {
	pool := testPool(t)
	scope, target := uniqueName(t), uniqueName(t)
	tx, err := pool.Begin(testCtx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Prepare(testCtx, tx, scope, "rolled-back", target, map[string]int{"amount": 1}, PrepareOptions{})
	if err != nil || p.State != "pending" || len(p.Key) != 36 || p.Attempts != 0 || p.Response != nil {
		t.Fatalf("prepare: %+v, %v", p, err)
	}
	_ = tx.Rollback(testCtx)
	if n := countRows(t, pool, `SELECT count(*) FROM idempotency.outbound WHERE scope = $1`, scope); n != 0 {
		t.Errorf("a rolled-back prepare left %d rows", n)
	}

	first := prepared(t, scope, "twice", target, map[string]any{"amount": 1, "currency": "eur"})
	again := prepared(t, scope, "twice", target, map[string]any{"currency": "eur", "amount": 1.0})
	if again.Key != first.Key {
		t.Errorf("the same operation prepared twice: keys %s and %s", first.Key, again.Key)
	}
	_, err = Prepare(testCtx, pool, scope, "twice", target, map[string]int{"amount": 2}, PrepareOptions{})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "IK004" || !errors.Is(err, ErrOperationReused) {
		t.Errorf("the same operation with another request: %v; want SQLSTATE IK004", err)
	}
	own := prepared(t, scope, "own-key", target, nil)
	if own.Key == first.Key {
		t.Error("two operations share a key")
	}
	_, err = Prepare(testCtx, pool, scope, "bad-key", target, nil, PrepareOptions{Key: "a\nb"})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a key with a control character: %v; want ErrInvalidArgument", err)
	}
}

func TestSenderDeliver(t *testing.T) {
	scope, target := uniqueName(t), uniqueName(t)
	r := newReceiver(t, reply{status: 201, headers: map[string]string{"Location": "/charges/ch_1"}})
	var finished []Result
	s := newTestSender(t, SenderOptions{URLs: map[string]string{target: r.URL + "/charges"},
		Headers:    map[string]map[string]string{target: {"X-Api-Key": "tenant-1"}},
		OnFinished: func(_ Attempt, res Result) { finished = append(finished, res) }})
	p := prepared(t, scope, "order-1:charge", target, map[string]any{"amount": 5, "currency": "eur"})

	res, err := s.Deliver(testCtx, scope, "order-1:charge")
	d, ok := res.(Delivered)
	if err != nil || !ok || d.Status != 201 || d.Headers["location"] != "/charges/ch_1" || string(d.Body) != `{"ok": true}` {
		t.Fatalf("deliver: %#v, %v; want Delivered 201", res, err)
	}
	keys, bodies := r.seen()
	if len(keys) != 1 || keys[0] != `"`+p.Key+`"` || bodies[0] != `{"amount": 5, "currency": "eur"}` {
		t.Errorf("the receiver saw %q %q; want Idempotency-Key: \"%s\" and the request", keys, bodies, p.Key)
	}
	if len(finished) != 1 {
		t.Errorf("OnFinished: %v", finished)
	}
	// Done: asking again sends nothing and answers from the record.
	res, err = s.Deliver(testCtx, scope, "order-1:charge")
	if d, ok := res.(Delivered); err != nil || !ok || d.Status != 201 || d.Headers["location"] != "/charges/ch_1" {
		t.Errorf("deliver again: %#v, %v", res, err)
	}
	if keys, _ := r.seen(); len(keys) != 1 {
		t.Errorf("a done send was sent again: %d requests", len(keys))
	}
	if again := prepared(t, scope, "order-1:charge", target, map[string]any{"amount": 5, "currency": "eur"}); again.Response == nil || again.Response.Status != 201 {
		t.Errorf("prepare of a done send: %+v; want its response", again)
	}
	if _, err := s.Status(testCtx, scope, "no-such-operation"); !errors.Is(err, ErrNoRecord) {
		t.Errorf("status of an unknown operation: %v; want ErrNoRecord", err)
	}
}

func TestSenderAnswers(t *testing.T) {
	scope := uniqueName(t)
	r503 := newReceiver(t, reply{status: 503})
	r422 := newReceiver(t, reply{status: 422})
	r429 := newReceiver(t, reply{status: 429, headers: map[string]string{"Retry-After": "30"}})
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // nothing listens there now
	targets, urls := map[string]string{}, map[string]string{}
	for name, url := range map[string]string{"503": r503.URL, "422": r422.URL, "429": r429.URL, "down": closed.URL} {
		targets[name] = uniqueName(t) + name
		urls[targets[name]] = url
	}
	s := newTestSender(t, SenderOptions{URLs: urls})

	prepared(t, scope, "503", targets["503"], nil)
	res, err := s.Deliver(testCtx, scope, "503")
	if n, ok := res.(NotYet); err != nil || !ok || n.State != "pending" || n.Attempts != 1 || n.LastStatus != 503 {
		t.Errorf("503: %#v, %v; want NotYet pending", res, err)
	}

	prepared(t, scope, "422", targets["422"], nil)
	res, err = s.Deliver(testCtx, scope, "422")
	if d, ok := res.(Delivered); err != nil || !ok || d.Status != 422 {
		t.Errorf("422: %#v, %v; want Delivered 422 (a final answer)", res, err)
	}
	if n, err := s.RunOnce(testCtx, targets["422"]); n != 0 || err != nil {
		t.Errorf("a 422 retried: %d, %v", n, err)
	}

	prepared(t, scope, "429", targets["429"], nil)
	before := time.Now()
	res, err = s.Deliver(testCtx, scope, "429")
	n, ok := res.(NotYet)
	if err != nil || !ok || n.LastStatus != 429 || n.NextAttemptAt.Before(before.Add(29*time.Second)) {
		t.Errorf("429 with Retry-After: 30: %#v, %v; want the next attempt 30 s ahead", res, err)
	}
	if st, err := s.Status(testCtx, scope, "429"); err != nil || st.(NotYet).NextAttemptAt != n.NextAttemptAt {
		t.Errorf("status: %#v, %v", st, err)
	}

	prepared(t, scope, "down", targets["down"], nil)
	res, err = s.Deliver(testCtx, scope, "down")
	if n, ok := res.(NotYet); err != nil || !ok || n.LastStatus != 0 || !strings.HasPrefix(n.LastError, "connection failed") {
		t.Errorf("a receiver that is down: %#v, %v; want NotYet with no answer", res, err)
	}
}

func TestSenderLost(t *testing.T) {
	scope, target := uniqueName(t), uniqueName(t)
	var finished []Result
	s := newTestSender(t, SenderOptions{Lease: 100 * time.Millisecond, Timeout: 50 * time.Millisecond,
		Send:       func(context.Context, Attempt) Answer { return Answer{Status: 201} },
		OnFinished: func(_ Attempt, res Result) { finished = append(finished, res) }})
	prepared(t, scope, "op", target, nil)
	first, firstLease, err := s.take(testCtx, "", 1, scope, "op")
	if err != nil || len(first) != 1 || first[0].Number != 1 {
		t.Fatalf("take: %+v, %v", first, err)
	}
	time.Sleep(300 * time.Millisecond) // the lease lapses
	second, secondLease, err := s.take(testCtx, target, 1, "", "")
	if err != nil || len(second) != 1 || second[0].Number != 2 || second[0].Token == first[0].Token {
		t.Fatalf("take after the lease: %+v, %v", second, err)
	}
	res, err := s.attempt(testCtx, first[0], firstLease)
	if res != (Lost{Scope: scope, Operation: "op"}) || err != nil {
		t.Errorf("recorded with the first token: %#v, %v; want Lost", res, err)
	}
	res, err = s.attempt(testCtx, second[0], secondLease)
	if d, ok := res.(Delivered); err != nil || !ok || d.Status != 201 {
		t.Errorf("recorded with the second token: %#v, %v; want Delivered", res, err)
	}
	if len(finished) != 1 {
		t.Errorf("OnFinished: %#v; want the second attempt only", finished)
	}
}

func TestSenderRun(t *testing.T) {
	scope, target := uniqueName(t), uniqueName(t)
	r := newReceiver(t, reply{status: 503}, reply{status: 201})
	s := newTestSender(t, SenderOptions{URLs: map[string]string{target: r.URL}})
	p := prepared(t, scope, "op", target, nil)
	s.Run(testCtx, target, true)
	keys, _ := r.seen()
	if len(keys) != 2 || keys[0] != KeyHeader(p.Key) || keys[1] != keys[0] {
		t.Errorf("requests: %q; want two with the key", keys)
	}
	if idle, err := s.Idle(testCtx, target); !idle || err != nil {
		t.Errorf("idle: %v, %v", idle, err)
	}
	if res, err := s.Status(testCtx, scope, "op"); err != nil || res.(Delivered).Status != 201 {
		t.Errorf("status: %#v, %v", res, err)
	}
}

// The worker wakes on the NOTIFY of a committed send (its poll is a minute), and stopping it
// mid-attempt lets the attempt finish and be recorded.
func TestSenderRunWakesAndStops(t *testing.T) {
	scope, target := uniqueName(t), uniqueName(t)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	r := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(201)
	}))
	defer r.Close()
	s := newTestSender(t, SenderOptions{URLs: map[string]string{target: r.URL}, PollInterval: time.Minute})
	ctx, stop := context.WithCancel(testCtx)
	done := make(chan struct{})
	go func() { s.Run(ctx, target, false); close(done) }()
	time.Sleep(500 * time.Millisecond) // the worker has found nothing and waits
	prepared(t, scope, "op", target, nil)
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not wake up on the NOTIFY")
	}
	stop()
	select {
	case <-done:
		t.Fatal("Run returned with an attempt in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the attempt in flight")
	}
	if res, err := s.Status(testCtx, scope, "op"); err != nil || res.(Delivered).Status != 201 {
		t.Errorf("the attempt in flight at the stop: %#v, %v; want it recorded", res, err)
	}
}

// An answer cut off mid-body is no answer.
func TestSenderCutAnswer(t *testing.T) {
	scope, target := uniqueName(t), uniqueName(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 4096))
			_, _ = c.Write([]byte("HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"partial"))
			c.Close()
		}
	}()
	s := newTestSender(t, SenderOptions{URLs: map[string]string{target: "http://" + ln.Addr().String()}})
	prepared(t, scope, "op", target, nil)
	res, err := s.Deliver(testCtx, scope, "op")
	if n, ok := res.(NotYet); err != nil || !ok || n.LastStatus != 0 || !strings.HasPrefix(n.LastError, "no answer") {
		t.Errorf("a cut answer: %#v, %v; want NotYet with no answer", res, err)
	}
}

// recordings logs, in a table of its own, each result recorded for target's sends: the
// operation and the transaction that recorded it, in the order they were recorded.
func recordings(t *testing.T, target string) func() (ops []string, transactions int) {
	t.Helper()
	pool := testPool(t)
	table := "public.test_go_recorded_" + NewToken()[:8]
	mustExec(t, pool, "CREATE TABLE "+table+" (n bigserial, xact xid8, operation text)")
	t.Cleanup(func() { mustExec(t, pool, "DROP TABLE "+table) })
	onRecord(t, target, "INSERT INTO "+table+" (xact, operation) VALUES (pg_current_xact_id(), NEW.operation);")
	return func() ([]string, int) {
		rows, err := pool.Query(testCtx, "SELECT operation FROM "+table+" ORDER BY n")
		if err != nil {
			t.Fatal(err)
		}
		ops, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ops, countRows(t, pool, "SELECT count(DISTINCT xact) FROM "+table)
	}
}

// A round of several sends has their answers recorded together: one statement, one
// transaction, the rows in (scope, operation) order; a round of one keeps the single call.
func TestSenderRoundRecordedTogether(t *testing.T) {
	scope, target := uniqueName(t), uniqueName(t)
	logged := recordings(t, target)
	statuses := map[string]int{"c": 201, "a": 503, "b": 400, "d": 202}
	var mu sync.Mutex
	var finished []string
	s := newTestSender(t, SenderOptions{Concurrency: 4,
		Send: func(_ context.Context, a Attempt) Answer { // a's retry due in an hour
			return Answer{Status: statuses[a.Operation], Headers: map[string]string{"retry-after": "3600"}}
		},
		OnFinished: func(a Attempt, _ Result) {
			mu.Lock()
			defer mu.Unlock()
			finished = append(finished, a.Operation)
		}})
	for _, op := range []string{"c", "a", "b"} {
		prepared(t, scope, op, target, nil)
	}
	if n, err := s.RunOnce(testCtx, target); n != 3 || err != nil {
		t.Fatalf("round: %d, %v; want 3", n, err)
	}
	if ops, xacts := logged(); strings.Join(ops, " ") != "a b c" || xacts != 1 {
		t.Errorf("recorded %q in %d transactions; want a b c in one", ops, xacts)
	}
	want := map[string]Result{"a": nil, "b": Delivered{Status: 400}, "c": Delivered{Status: 201}}
	for op, w := range want {
		res, err := s.Status(testCtx, scope, op)
		if n, ok := res.(NotYet); w == nil && (err != nil || !ok || n.State != "pending" || n.Attempts != 1 || n.LastStatus != 503) {
			t.Errorf("%s: %#v, %v; want pending after one attempt answered 503", op, res, err)
		}
		if d, ok := res.(Delivered); w != nil && (err != nil || !ok || d.Status != w.(Delivered).Status) {
			t.Errorf("%s: %#v, %v; want %#v", op, res, err, w)
		}
	}
	mu.Lock()
	slices.Sort(finished)
	if strings.Join(finished, " ") != "b c" {
		t.Errorf("OnFinished for %q; want b and c", finished)
	}
	mu.Unlock()

	prepared(t, scope, "d", target, nil)
	if n, err := s.RunOnce(testCtx, target); n != 1 || err != nil {
		t.Fatalf("round of one: %d, %v", n, err)
	}
	if ops, xacts := logged(); strings.Join(ops, " ") != "a b c d" || xacts != 2 {
		t.Errorf("recorded %q in %d transactions; want a b c d in two", ops, xacts)
	}
}

// When the extension refuses one answer of a round (IK002: its lease was lost; IK003: recorded
// already) the statement records none of them, and each is recorded on its own.
func TestSenderRoundFallsBack(t *testing.T) {
	t.Run("IK002", func(t *testing.T) {
		scope, target := uniqueName(t), uniqueName(t)
		logged := recordings(t, target)
		var mu sync.Mutex
		var finished []string
		s := newTestSender(t, SenderOptions{Lease: 200 * time.Millisecond, Timeout: 100 * time.Millisecond,
			Send: func(context.Context, Attempt) Answer { return Answer{Status: 201} },
			OnFinished: func(a Attempt, _ Result) {
				mu.Lock()
				defer mu.Unlock()
				finished = append(finished, a.Operation)
			}})
		for _, op := range []string{"a", "b", "c"} {
			prepared(t, scope, op, target, nil)
		}
		taken, _, err := s.take(testCtx, target, 3, "", "")
		if err != nil || len(taken) != 3 {
			t.Fatalf("take: %+v, %v", taken, err)
		}
		time.Sleep(300 * time.Millisecond) // the leases lapse, and another sender takes b over
		other, otherLease, err := s.take(testCtx, "", 1, scope, "b")
		if err != nil || len(other) != 1 || other[0].Number != 2 {
			t.Fatalf("take b over: %+v, %v", other, err)
		}
		answers := []Answer{{Status: 201}, {Status: 201}, {Status: 201}}
		results, err := s.recordRound(testCtx, taken, answers)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range taken {
			_, delivered := results[i].(Delivered)
			if a.Operation == "b" && results[i] != (Lost{Scope: scope, Operation: "b"}) || a.Operation != "b" && !delivered {
				t.Errorf("%s: %#v; want Lost for b, Delivered for the others", a.Operation, results[i])
			}
		}
		if ops, xacts := logged(); strings.Join(ops, " ") != "a c" || xacts != 2 {
			t.Errorf("recorded %q in %d transactions; want a and c, each in its own", ops, xacts)
		}
		if res, err := s.attempt(testCtx, other[0], otherLease); err != nil || res.(Delivered).Status != 201 {
			t.Errorf("b recorded by the sender that took it over: %#v, %v", res, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if strings.Join(finished, " ") != "a c b" {
			t.Errorf("OnFinished for %q; want a, c, then b (the second sender's)", finished)
		}
	})
	t.Run("IK003", func(t *testing.T) {
		scope, target := uniqueName(t), uniqueName(t)
		logged := recordings(t, target)
		s := newTestSender(t, SenderOptions{Send: func(context.Context, Attempt) Answer { return Answer{Status: 201} }})
		for _, op := range []string{"a", "b", "c"} {
			prepared(t, scope, op, target, nil)
		}
		taken, _, err := s.take(testCtx, target, 3, "", "")
		if err != nil || len(taken) != 3 {
			t.Fatalf("take: %+v, %v", taken, err)
		}
		answers := []Answer{{Status: 201, Headers: map[string]string{}}, {Status: 409, Headers: map[string]string{}},
			{Status: 201, Headers: map[string]string{}}}
		for i, a := range taken {
			if a.Operation == "b" { // recorded already: the reply to its COMMIT was lost, say
				answers[i].Status = 202
				if _, err := s.record(testCtx, a, answers[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
		results, err := s.recordRound(testCtx, taken, answers)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range taken {
			want := map[string]int{"a": 201, "b": 202, "c": 201}[a.Operation]
			if d, ok := results[i].(Delivered); !ok || d.Status != want {
				t.Errorf("%s: %#v; want Delivered %d", a.Operation, results[i], want)
			}
			if res, err := s.Status(testCtx, scope, a.Operation); err != nil || res.(Delivered).Status != want {
				t.Errorf("%s's row: %#v, %v; want done with %d", a.Operation, res, err, want)
			}
		}
		if ops, xacts := logged(); strings.Join(ops, " ") != "b a c" || xacts != 3 {
			t.Errorf("recorded %q in %d transactions; want b, then a and c, each in its own", ops, xacts)
		}
		if n := countRows(t, testPool(t), `SELECT count(*) FROM idempotency.outbound WHERE scope = $1
			AND attempts = 1`, scope); n != 3 {
			t.Errorf("%d sends with one attempt; want 3", n)
		}
	})
}
