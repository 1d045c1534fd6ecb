package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Sessions the server ends under the middleware (what a restart or a shutdown does to each
// connection: pg_terminate_backend sends the same 57P01), on the real database, directly (not
// through PgBouncer, which hides a server connection's end from its clients).

// syncBuffer is a log destination that tests read while the middleware writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// namedPool is a pool whose sessions carry their own application_name, which never pings a
// connection before lending it (so a dead one reaches the middleware).
func namedPool(t *testing.T, name string) *pgxpool.Pool {
	t.Helper()
	testPool(t)
	cfg, err := ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(testCtx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// terminate ends the sessions matching where (on pg_stat_activity) and waits until they are
// gone; it returns how many there were. It may run in a handler (it does not stop the test).
func terminate(pool *pgxpool.Pool, where string, args ...any) (int, error) {
	var n int
	err := pool.QueryRow(testCtx, `SELECT count(pg_terminate_backend(pid))
		FROM (SELECT pid FROM pg_stat_activity WHERE `+where+` OFFSET 0) s`, args...).Scan(&n)
	for deadline := time.Now().Add(10 * time.Second); err == nil; time.Sleep(10 * time.Millisecond) {
		var left int
		if err = pool.QueryRow(testCtx, `SELECT count(*) FROM pg_stat_activity WHERE `+where, args...).Scan(&left); err == nil && left == 0 {
			return n, nil
		}
		if time.Now().After(deadline) {
			err = fmt.Errorf("%d sessions still there after pg_terminate_backend", left)
		}
	}
	return n, err
}

func TestEndedSessionsClaimSentAgain(t *testing.T) {
	for _, route := range []string{"/charges", "/charges/external"} {
		t.Run(route, func(t *testing.T) {
			name := uniqueName(t)
			pool := namedPool(t, name)
			logs := &syncBuffer{}
			app := &testApp{pool: pool, cause: make(chan error, 1)}
			m := New(pool, Options{Tenant: tenantOf, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			mux := http.NewServeMux()
			mux.Handle("POST /charges", m.Protect(Policy{})(http.HandlerFunc(app.handler)))
			mux.Handle("POST /charges/external", m.Protect(Policy{Mode: CommittedFirst})(http.HandlerFunc(app.handler)))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			tenant := "X-Api-Key: " + name
			if r := post(t, srv.URL+route, `{"amount": 3}`, key(NewToken()), tenant); r.status != 201 {
				t.Fatalf("before: %v", r)
			}
			if n, err := terminate(testPool(t), "application_name = $1", name); err != nil || n == 0 {
				t.Fatalf("ending the pool's sessions: %d ended, %v", n, err)
			}
			k := NewToken()
			r := post(t, srv.URL+route, `{"amount": 4}`, key(k), tenant)
			if r.status != 201 || r.replayed() {
				t.Errorf("the first request after its pool's sessions ended: %v; want 201", r)
			}
			if !strings.Contains(logs.String(), "connection was lost") {
				t.Errorf("the claim was not sent again (log: %s)", logs.String())
			}
			if again := post(t, srv.URL+route, `{"amount": 4}`, key(k), tenant); !again.replayed() {
				t.Errorf("the same request again: %v; want its replay", again)
			}
		})
	}
}

// A same-transaction handler whose session the server ends while it runs (before or after its
// own write): 503 problem (nothing was committed), nothing stored, and the same key runs later.
func TestEndedSessionWhileHandlerRan(t *testing.T) {
	for _, when := range []string{"before its write", "after its write"} {
		t.Run(when, func(t *testing.T) {
			name := uniqueName(t)
			pool := namedPool(t, name)
			m := New(pool, Options{Tenant: tenantOf, Logger: slog.New(slog.NewTextHandler(&syncBuffer{}, nil))})
			admin := testPool(t)
			var end atomic.Bool
			end.Store(true)
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx := FromRequest(r).Tx()
				ctx := r.Context()
				var pid int32
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				if end.Load() && when == "before its write" {
					_, _ = terminate(admin, "pid = $1", pid)
				}
				var id int64
				err := tx.QueryRow(ctx, `INSERT INTO go_test_charges (scope, amount) VALUES ($1, 1) RETURNING id`,
					name).Scan(&id)
				if end.Load() && when == "after its write" {
					_, _ = terminate(admin, "pid = $1", pid)
				}
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				w.WriteHeader(201)
				_, _ = fmt.Fprintf(w, `{"id": %d}`, id)
			})
			mux := http.NewServeMux()
			mux.Handle("POST /charges", m.Protect(Policy{})(handler))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			k := NewToken()
			r := post(t, srv.URL+"/charges", `{"amount": 1}`, key(k), "X-Api-Key: "+name)
			if !isProblem(r, 503, slugUnavailable) || r.header.Get("Retry-After") != "1" {
				t.Errorf("the session ended %s: %v; want the 503 problem with Retry-After", when, r)
			}
			if n := countRows(t, testPool(t), `SELECT count(*) FROM go_test_charges WHERE scope = $1`, name); n != 0 {
				t.Errorf("%d rows written; want none (nothing committed)", n)
			}
			end.Store(false)
			again := post(t, srv.URL+"/charges", `{"amount": 1}`, key(k), "X-Api-Key: "+name)
			if again.status != 201 || again.replayed() {
				t.Errorf("the same key then: %v; want 201, run as new", again)
			}
		})
	}
}

// The same-transaction claim is deferred (extension 0.6.0, native edition): while the handler
// runs, its transaction has written nothing: no transaction id (pg_stat_activity, seen from
// another connection) and no row in idempotency.keys, even within the transaction, where
// idem_lookup answers in_progress and the key's lock is held (pg_locks, objsubid 7649).
func TestHTTPSameTransactionClaimDeferred(t *testing.T) {
	pool := testPool(t)
	if has, err := ClaimTakesDeferred(testCtx, pool); err != nil || !has {
		t.Skipf("the installed extension's idem_claim has no deferred argument (before 0.6.0): %v", err)
	}
	if countRows(t, pool, `SELECT count(*) FROM pg_proc WHERE proname = 'idem_scope_support'`) == 0 {
		t.Skip("the portable edition writes a deferred claim's record at once (docs/portable.md)")
	}
	type seen struct {
		xid      *string
		keyLocks int
		rows     int
		lookedUp string
	}
	observed := make(chan seen, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ctx := FromRequest(r), r.Context()
		var s seen
		var pid int32
		err := h.Tx().QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
		if err == nil {
			err = pool.QueryRow(ctx, `SELECT backend_xid::text FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&s.xid)
		}
		if err == nil {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory'
				AND objsubid = 7649 AND granted`, pid).Scan(&s.keyLocks)
		}
		if err == nil {
			err = h.Tx().QueryRow(ctx, `SELECT count(*) FROM idempotency.keys WHERE scope = $1 AND key = $2`,
				h.Scope, h.Key).Scan(&s.rows)
		}
		var rec *Record
		if err == nil {
			rec, err = Lookup(ctx, h.Tx(), h.Scope, h.Key)
		}
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if rec != nil {
			s.lookedUp = rec.Status
		}
		observed <- s
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"ok": true}`))
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", New(pool, Options{Tenant: tenantOf}).Protect(Policy{})(handler))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tenant, k := uniqueName(t), NewToken()
	r := post(t, srv.URL+"/orders", `{"amount": 1}`, key(k), "X-Api-Key: "+tenant)
	if r.status != 201 {
		t.Fatalf("%v", r)
	}
	s := <-observed
	if s.xid != nil || s.keyLocks != 1 || s.rows != 0 || s.lookedUp != "in_progress" {
		t.Errorf("while the handler ran: transaction id %v, %d key locks, %d rows in idempotency.keys, idem_lookup %q; "+
			"want none, 1, 0 and in_progress", deref(s.xid), s.keyLocks, s.rows, s.lookedUp)
	}
	if rec, err := Lookup(testCtx, pool, tenant+":POST /orders", k); err != nil || rec == nil || rec.Status != "completed" {
		t.Errorf("after: %+v, %v; want the completed record", rec, err)
	}
}
