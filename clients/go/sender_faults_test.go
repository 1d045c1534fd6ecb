package idempotency

// Issue 32 against real servers and sessions: an attempt bounded in total by the timeout (a
// receiver that answers a byte at a time), and the worker outliving its database (its backends
// terminated, a real deadlock, a serialization failure, its server stopped and started again:
// test.sh's send-outage cluster); the sender's own settings.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// trickler answers every request with the header block at once (or, headerToo, a byte at a
// time too) and then the body, n bytes, a byte every `every`: no read waits long enough for a
// per-read timeout. closed gets how long each connection stayed open before the sender closed
// it (-1: answered in full).
func trickler(t *testing.T, headerToo bool, every time.Duration, n int) (url string, closed chan time.Duration) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	head := fmt.Sprintf("HTTP/1.1 201 Created\r\nX-Slow: %s\r\nContent-Length: %d\r\n\r\n", strings.Repeat("y", n), n)
	full, atOnce := head+strings.Repeat("x", n), len(head)
	if headerToo {
		atOnce = 0
	}
	closed = make(chan time.Duration, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				began := time.Now()
				_, _ = c.Read(make([]byte, 4096))
				_, _ = c.Write([]byte(full[:atOnce]))
				for i := atOnce; i < len(full); i++ {
					if _, err := c.Write([]byte{full[i]}); err != nil {
						closed <- time.Since(began)
						return
					}
					time.Sleep(every)
				}
				closed <- -1
			}()
		}
	}()
	return "http://" + ln.Addr().String(), closed
}

func TestSenderTimeoutBoundsTheWholeAttempt(t *testing.T) {
	for _, headerToo := range []bool{false, true} {
		t.Run(fmt.Sprintf("headerToo=%v", headerToo), func(t *testing.T) {
			scope, target := uniqueName(t), uniqueName(t)
			url, closed := trickler(t, headerToo, 50*time.Millisecond, 100) // 5 s in full
			s := newTestSender(t, SenderOptions{URLs: map[string]string{target: url},
				Timeout: 500 * time.Millisecond, Lease: 2 * time.Second})
			prepared(t, scope, "op", target, nil)
			began := time.Now()
			res, err := s.Deliver(testCtx, scope, "op")
			took := time.Since(began)
			if n, ok := res.(NotYet); err != nil || !ok || n.LastStatus != 0 || n.LastError != "timed out" {
				t.Errorf("a trickled answer: %#v, %v; want NotYet, timed out", res, err)
			}
			if took > 1500*time.Millisecond {
				t.Errorf("the attempt took %v with a timeout of 500 ms", took)
			}
			select {
			case open := <-closed:
				if open < 0 || open > 1500*time.Millisecond {
					t.Errorf("the connection was open for %v (-1: answered in full)", open)
				}
			case <-time.After(5 * time.Second):
				t.Error("the sender did not close the trickled connection")
			}
		})
	}
	// The end of the lease bounds it too: an attempt that starts with 300 ms of its lease left.
	target := uniqueName(t)
	url, _ := trickler(t, false, 50*time.Millisecond, 100)
	s := newTestSender(t, SenderOptions{URLs: map[string]string{target: url}, Timeout: 2 * time.Second,
		Lease: 5 * time.Second})
	began := time.Now()
	answer := s.send(testCtx, Attempt{Target: target, Key: "k"}, began.Add(300*time.Millisecond))
	if took := time.Since(began); answer.Error != "timed out" || took > time.Second {
		t.Errorf("an attempt with 300 ms of its lease left: %+v after %v", answer, took)
	}
}

// records is a slog.Handler that keeps what the sender logs.
type records struct {
	mu   sync.Mutex
	kept []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kept = append(r.kept, rec.Clone())
	return nil
}

// codes are the "code" attributes of the LogDBError records, in order.
func (r *records) codes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var codes []string
	for _, rec := range r.kept {
		if rec.Message == LogDBError {
			if rec.Level != slog.LevelWarn {
				codes = append(codes, "not a warning")
			}
			rec.Attrs(func(a slog.Attr) bool {
				if a.Key == "code" {
					codes = append(codes, a.Value.String())
				}
				return true
			})
		}
	}
	return codes
}

func (r *records) count(message string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.kept {
		if strings.HasPrefix(rec.Message, message) {
			n++
		}
	}
	return n
}

// faultPool is a pool of its own on url whose sessions carry an application_name of their own
// (the worker's LISTEN session too: it is made with the pool's config), so that only they are
// terminated or looked for.
func faultPool(t *testing.T, url string) (*pgxpool.Pool, string) {
	t.Helper()
	app := "idem-go-" + NewToken()[:8]
	cfg, err := ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(testCtx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, app
}

// held is a receiver that holds each request until release is closed (arrived gets each
// arrival) and then answers 201.
type held struct {
	*httptest.Server
	arrived chan struct{}
	release chan struct{}
	mu      sync.Mutex
	keys    []string
}

func newHeld(t *testing.T) *held {
	h := &held{arrived: make(chan struct{}, 10), release: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.mu.Lock()
		h.keys = append(h.keys, req.Header.Get("Idempotency-Key"))
		h.mu.Unlock()
		h.arrived <- struct{}{}
		<-h.release
		w.WriteHeader(201)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *held) requests() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.keys)
}

// worker runs s.Run in a goroutine; stop checks that it had not returned before, stops it and
// waits for it.
func worker(t *testing.T, s *Sender, target string) (stop func()) {
	ctx, cancel := context.WithCancel(testCtx)
	done := make(chan struct{})
	go func() { s.Run(ctx, target, false); close(done) }()
	return func() {
		t.Helper()
		select {
		case <-done:
			t.Error("Run returned before its context was cancelled")
		default:
		}
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	}
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if f() {
			return
		}
	}
	t.Fatalf("waited 30 s for %s", what)
}

// sendState is the send's state and attempts, read on a connection of its own.
func sendState(t *testing.T, url, scope, operation string) (string, int) {
	t.Helper()
	conn, err := pgx.Connect(testCtx, url)
	if err != nil {
		return "unreachable: " + err.Error(), 0
	}
	defer conn.Close(testCtx)
	var state string
	var attempts int
	if err := conn.QueryRow(testCtx, `SELECT state, attempts FROM idempotency.outbound
		WHERE scope = $1 AND operation = $2`, scope, operation).Scan(&state, &attempts); err != nil {
		return "no row: " + err.Error(), 0
	}
	return state, attempts
}

func preparedOn(t *testing.T, pool *pgxpool.Pool, scope, operation, target string) {
	t.Helper()
	err := pgx.BeginFunc(testCtx, pool, func(tx pgx.Tx) error {
		_, err := Prepare(testCtx, tx, scope, operation, target, map[string]int{"amount": 1}, PrepareOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// faultSender: quick retries and reconnections, the given lease and timeout, its log kept.
func faultSender(t *testing.T, pool *pgxpool.Pool, url, target string, lease, timeout time.Duration) (*Sender, *records) {
	t.Helper()
	log := &records{}
	s, err := NewSender(pool, SenderOptions{URLs: map[string]string{target: url}, Lease: lease, Timeout: timeout,
		BackoffBase: 50 * time.Millisecond, BackoffCap: 200 * time.Millisecond,
		ReconnectBase: 50 * time.Millisecond, ReconnectCap: 500 * time.Millisecond,
		PollInterval: 200 * time.Millisecond, Logger: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	return s, log
}

func TestSenderWorkerBackendsTerminated(t *testing.T) {
	url := os.Getenv("DATABASE_URL")
	testPool(t) // skips without a database
	pool, app := faultPool(t, url)
	scope, target := uniqueName(t), uniqueName(t)
	r := newHeld(t)
	preparedOn(t, pool, scope, "op", target)
	s, log := faultSender(t, pool, r.URL, target, 10*time.Second, 5*time.Second)
	stop := worker(t, s, target)
	<-r.arrived
	terminated := countRows(t, testPool(t), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1`, app)
	if terminated < 2 { // the pool's session (at least one) and the LISTEN session
		t.Errorf("%d sessions terminated; want the pool's and the LISTEN one", terminated)
	}
	close(r.release)
	waitUntil(t, "the answer recorded", func() bool { st, _ := sendState(t, url, scope, "op"); return st == "done" })
	preparedOn(t, pool, scope, "then", target) // and it goes on
	waitUntil(t, "the next send", func() bool { st, _ := sendState(t, url, scope, "then"); return st == "done" })
	stop()
	if st, attempts := sendState(t, url, scope, "op"); st != "done" || attempts != 1 || r.requests() != 2 {
		t.Errorf("%s after %d attempts, %d requests; want done after 1 (recorded after reconnecting), 2 requests",
			st, attempts, r.requests())
	}
	codes := log.codes()
	if len(codes) == 0 || codes[0] != "57P01" && codes[0] != "ConnectionLost" {
		t.Errorf("logged database errors %v; want 57P01 (or ConnectionLost) first", codes)
	}
	if log.count(LogDBReconnected) < 1 || log.count("idempotency sender: recorded an answer after reconnecting") != 1 {
		t.Errorf("reconnected %d times, recorded after reconnecting %d times; want 1 or more, 1",
			log.count(LogDBReconnected), log.count("idempotency sender: recorded an answer after reconnecting"))
	}
}

// onRecord installs a BEFORE UPDATE trigger on idempotency.outbound for target's rows only,
// when a result is recorded (the new state is not sending); dropped after the test.
func onRecord(t *testing.T, target, body string) {
	t.Helper()
	pool := testPool(t)
	name := "test_go_sender_" + strings.NewReplacer("-", "_", "/", "_").Replace(strings.ToLower(target))
	mustExec(t, pool, fmt.Sprintf(`CREATE FUNCTION public.%s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN %s RETURN NEW; END $$`, name, body))
	mustExec(t, pool, fmt.Sprintf(`CREATE TRIGGER %s BEFORE UPDATE ON idempotency.outbound FOR EACH ROW
		WHEN (NEW.target = '%s' AND NEW.state <> 'sending') EXECUTE FUNCTION public.%[1]s()`, name, target))
	t.Cleanup(func() {
		mustExec(t, pool, fmt.Sprintf("DROP TRIGGER %s ON idempotency.outbound", name))
		mustExec(t, pool, fmt.Sprintf("DROP FUNCTION public.%s()", name))
	})
}

// A real deadlock: the sender's recording holds the send's row and waits for an advisory lock
// (the trigger takes it) that another session holds, which then asks for the row. PostgreSQL
// aborts the sender's transaction (its deadlock_timeout, 1 s, is the shorter); the worker
// reconnects and records the answer.
func TestSenderWorkerDeadlock(t *testing.T) {
	url := os.Getenv("DATABASE_URL")
	testPool(t)
	pool, app := faultPool(t, url)
	scope, target := uniqueName(t), uniqueName(t)
	onRecord(t, target, "PERFORM pg_advisory_xact_lock(4242);")
	r := newReceiver(t, reply{status: 201})
	preparedOn(t, pool, scope, "op", target)
	holder, err := testPool(t).Begin(testCtx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(testCtx) }()
	mustExec(t, holder, "SET LOCAL deadlock_timeout = '30s'")
	mustExec(t, holder, "SELECT pg_advisory_xact_lock(4242)")
	s, log := faultSender(t, pool, r.URL, target, 20*time.Second, 5*time.Second)
	stop := worker(t, s, target)
	waitUntil(t, "the sender waiting for the advisory lock", func() bool {
		return countRows(t, testPool(t), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event = 'advisory'`, app) == 1
	})
	mustExec(t, holder, "SELECT 1 FROM idempotency.outbound WHERE scope = $1 AND operation = 'op' FOR UPDATE", scope)
	_ = holder.Rollback(testCtx)
	waitUntil(t, "the answer recorded", func() bool { st, _ := sendState(t, url, scope, "op"); return st == "done" })
	stop()
	if !strings.Contains(strings.Join(log.codes(), " "), "40P01") || log.count(LogDBReconnected) < 1 {
		t.Errorf("logged %v, %d reconnections; want 40P01 and a reconnection", log.codes(), log.count(LogDBReconnected))
	}
	if st, attempts := sendState(t, url, scope, "op"); st != "done" || attempts != 1 {
		t.Errorf("%s after %d attempts; want done after one", st, attempts)
	}
	if keys, _ := r.seen(); len(keys) != 1 {
		t.Errorf("%d requests; want 1", len(keys))
	}
}

// 40001, raised once by a trigger (the sender's READ COMMITTED transactions meet it from the
// application's own functions, e.g. on a table a trigger writes).
func TestSenderWorkerSerializationFailure(t *testing.T) {
	url := os.Getenv("DATABASE_URL")
	pool := testPool(t)
	scope, target := uniqueName(t), uniqueName(t)
	seq := "test_go_seq_" + NewToken()[:8]
	mustExec(t, pool, "CREATE SEQUENCE public."+seq)
	t.Cleanup(func() { mustExec(t, pool, "DROP SEQUENCE public."+seq) })
	onRecord(t, target, fmt.Sprintf(`IF nextval('public.%s') = 1 THEN
		RAISE EXCEPTION 'could not serialize access (this test)' USING ERRCODE = 'serialization_failure'; END IF;`, seq))
	r := newReceiver(t, reply{status: 201})
	prepared(t, scope, "op", target, nil)
	s, log := faultSender(t, pool, r.URL, target, 10*time.Second, 5*time.Second)
	stop := worker(t, s, target)
	waitUntil(t, "the answer recorded", func() bool { st, _ := sendState(t, url, scope, "op"); return st == "done" })
	stop()
	if codes := log.codes(); len(codes) != 1 || codes[0] != "40001" || log.count(LogDBReconnected) != 1 {
		t.Errorf("logged %v, %d reconnections; want [40001], 1", codes, log.count(LogDBReconnected))
	}
	if st, attempts := sendState(t, url, scope, "op"); st != "done" || attempts != 1 {
		t.Errorf("%s after %d attempts; want done after one", st, attempts)
	}
}

// sendOutage is test.sh's send-outage cluster (a unix socket only), which this test stops and
// starts again: its URL and a pg_ctl for it.
func sendOutage(t *testing.T) (string, func(args ...string)) {
	url, pgCtl, data := os.Getenv("GO_SEND_OUTAGE_URL"), os.Getenv("GO_OUTAGE_PGCTL"), os.Getenv("GO_SEND_OUTAGE_DATA")
	if url == "" || pgCtl == "" || data == "" {
		t.Skip("GO_SEND_OUTAGE_URL, GO_OUTAGE_PGCTL or GO_SEND_OUTAGE_DATA is not set: clients/go/test.sh starts " +
			"the cluster this test restarts")
	}
	return url, func(args ...string) {
		t.Helper()
		cmd := exec.Command(pgCtl, append([]string{"-D", data, "-w", "-l", filepath.Join(filepath.Dir(data), "server.log")},
			args...)...)
		if os.Getuid() == 0 { // PostgreSQL does not run as root
			cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--"}, cmd.Args...)...)
		}
		cmd.Dir = "/"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pg_ctl %v: %v\n%s", args, err, out)
		}
	}
}

// The server stopped while an attempt is in flight, down for a while (connection refused, again
// and again), started again: with the lease still holding, the answer is recorded after
// reconnecting; with the lease ended meanwhile, it is dropped, and the send taken again
// (attempt 2, the same key).
func TestSenderWorkerServerRestarted(t *testing.T) {
	url, pgCtl := sendOutage(t)
	for _, c := range []struct {
		name           string
		lease, timeout time.Duration
		down           time.Duration
		attempts       int
	}{
		{"lease-holds", 10 * time.Second, 5 * time.Second, 1500 * time.Millisecond, 1},
		{"lease-ended", 2 * time.Second, 1500 * time.Millisecond, 2500 * time.Millisecond, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool, _ := faultPool(t, url)
			scope, target := uniqueName(t), uniqueName(t)
			r := newHeld(t)
			preparedOn(t, pool, scope, "op", target)
			s, log := faultSender(t, pool, r.URL, target, c.lease, c.timeout)
			stop := worker(t, s, target)
			<-r.arrived
			pgCtl("-m", "fast", "stop")
			func() {
				defer pgCtl("start")
				close(r.release)
				time.Sleep(c.down)
			}()
			whileDown := log.codes()
			waitUntil(t, "the send done", func() bool { st, _ := sendState(t, url, scope, "op"); return st == "done" })
			preparedOn(t, pool, scope, "then", target)
			waitUntil(t, "the next send", func() bool { st, _ := sendState(t, url, scope, "then"); return st == "done" })
			stop()
			if len(whileDown) < 2 || !strings.Contains(strings.Join(whileDown, " "), "ConnectError") {
				t.Errorf("logged while the server was down: %v; want the shutdown and refused connections", whileDown)
			}
			if log.count(LogDBReconnected) < 1 {
				t.Error("no reconnection logged")
			}
			st, attempts := sendState(t, url, scope, "op")
			r.mu.Lock()
			keys := r.keys
			r.mu.Unlock()
			if st != "done" || attempts != c.attempts || len(keys) != c.attempts+1 || keys[0] != keys[c.attempts-1] {
				t.Errorf("%s after %d attempts, requests %q; want done after %d", st, attempts, keys, c.attempts)
			}
			if c.attempts == 2 && log.count("idempotency sender: an answer was not recorded before its lease ended") != 1 {
				t.Error("the answer dropped after its lease was not logged")
			}
		})
	}
}

// The sender's own settings, each in its own transactions: through PgBouncer in transaction
// mode too (test.sh runs TestSenderSettings there), where no other transaction may see them.
func TestSenderSettings(t *testing.T) {
	pool := testPool(t)
	scope, target := uniqueName(t), uniqueName(t)

	s := newTestSender(t, SenderOptions{Send: func(context.Context, Attempt) Answer { return Answer{Status: 201} },
		GiveUpAfter: 90 * time.Second})
	err := pgx.BeginFunc(testCtx, pool, func(tx pgx.Tx) error {
		if _, err := s.Prepare(testCtx, tx, scope, "own", target, nil, PrepareOptions{}); err != nil {
			return err
		}
		_, err := s.Prepare(testCtx, tx, scope, "given", target, nil, PrepareOptions{GiveUpAfter: 30 * time.Second})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for op, want := range map[string]int{"own": 90, "given": 30} {
		if n := countRows(t, pool, `SELECT extract(epoch FROM give_up_at - created_at)::int FROM idempotency.outbound
			WHERE scope = $1 AND operation = $2`, scope, op); n != want {
			t.Errorf("give_up_after of %s: %d s; want %d", op, n, want)
		}
	}

	// Budget and backoff: 12 first attempts answered 503; each retry due within the senders'
	// cap (1 ms; the database's default is 10 minutes); the sender with budget 0 hands out no
	// retry, the one with the largest budget all 12.
	target = uniqueName(t)
	r := newReceiver(t, reply{status: 503})
	none, all := 0.0, MaxRetryBudget
	common := SenderOptions{URLs: map[string]string{target: r.URL}, Timeout: 2 * time.Second, Lease: 5 * time.Second,
		Concurrency: 50, BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}
	withBudget := func(b *float64) *Sender {
		o := common
		o.RetryBudget = b
		return newTestSender(t, o)
	}
	noRetries, allRetries := withBudget(&none), withBudget(&all)
	for i := range 12 {
		prepared(t, scope, fmt.Sprintf("budget-%d", i), target, nil)
	}
	var before, after time.Time
	_ = pool.QueryRow(testCtx, "SELECT clock_timestamp()").Scan(&before)
	if n, err := noRetries.RunOnce(testCtx, target); n != 12 || err != nil {
		t.Fatalf("first attempts: %d, %v; want 12 (never held back)", n, err)
	}
	_ = pool.QueryRow(testCtx, "SELECT clock_timestamp()").Scan(&after)
	if late := countRows(t, pool, `SELECT count(*) FROM idempotency.outbound WHERE target = $1
		AND NOT next_attempt_at BETWEEN $2 AND $3::timestamptz + interval '1 ms'`, target, before, after); late != 0 {
		t.Errorf("%d retries due later than the sender's backoff cap (1 ms) allows", late)
	}
	time.Sleep(50 * time.Millisecond)
	if n, err := noRetries.RunOnce(testCtx, target); n != 0 || err != nil {
		t.Errorf("budget 0: %d retries handed out, %v; want none", n, err)
	}
	if n, err := allRetries.RunOnce(testCtx, target); n != 12 || err != nil {
		t.Errorf("budget %g: %d retries handed out, %v; want 12", all, n, err)
	}
	if keys, _ := r.seen(); len(keys) != 24 {
		t.Errorf("%d requests; want 24", len(keys))
	}
	for range 5 { // whichever session the pool (or PgBouncer) hands out
		var budget, cap *string
		if err := pool.QueryRow(testCtx, `SELECT current_setting('idempotency.send_retry_budget', true),
			current_setting('idempotency.send_backoff_cap', true)`).Scan(&budget, &cap); err != nil {
			t.Fatal(err)
		}
		if budget != nil && (*budget == "0" || *budget == "1e+06") || cap != nil && *cap == "1000 microseconds" {
			t.Errorf("a sender's setting seen outside its transactions: budget %v, cap %v", deref(budget), deref(cap))
		}
	}
}
