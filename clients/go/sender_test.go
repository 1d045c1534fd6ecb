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
