package idempotency

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Round trips to PostgreSQL per request, counted on the wire: the middleware's pool connects
// through a TCP proxy that reads the protocol and counts the times the client starts sending
// while it has no answer pending (every Query and Sync it sent was answered by a ReadyForQuery).
// Messages sent before the earlier ones were answered (pipelined) belong to the same round
// trip. The proxy can hold round trips back, to show that an answer which writes nothing goes
// out before its ROLLBACK is done, and keeps the text of every statement sent (Parse, Query).

type tripProxy struct {
	addr      string
	mu        sync.Mutex
	trips     int
	holdAfter int // round trips after this many wait for release; -1: none held
	released  chan struct{}
	sql       []string // the statements sent since reset
}

func startTripProxy(t *testing.T, target string) *tripProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	p := &tripProxy{addr: ln.Addr().String(), holdAfter: -1, released: make(chan struct{})}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			pending := &atomic.Int64{}
			go p.frontend(client, server, pending)
			go backend(server, client, pending)
		}
	}()
	return p
}

// reset starts counting from zero, with the round trips after the first holdAfter held (-1: none).
func (p *tripProxy) reset(holdAfter int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trips, p.holdAfter, p.released, p.sql = 0, holdAfter, make(chan struct{}), nil
}

// statements are the texts of the statements sent since reset.
func (p *tripProxy) statements() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.sql...)
}

// claims are the idem_claim statements sent since reset.
func (p *tripProxy) claims() []string {
	var claims []string
	for _, s := range p.statements() {
		if strings.Contains(s, "idem_claim(") {
			claims = append(claims, s)
		}
	}
	return claims
}

// statementText is the SQL of a Parse ('P': name, then the text) or Query ('Q') message's body.
func statementText(kind byte, body []byte) (string, bool) {
	switch kind {
	case 'P':
		if i := bytes.IndexByte(body, 0); i >= 0 {
			body = body[i+1:]
		}
	case 'Q':
	default:
		return "", false
	}
	if i := bytes.IndexByte(body, 0); i >= 0 {
		body = body[:i]
	}
	return string(body), true
}

func (p *tripProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdAfter = -1
	close(p.released)
}

func (p *tripProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.trips
}

// nextMessage is the kind and length of the complete message at the start of buf (untyped
// while the startup message is not through), ok false when it is not complete yet.
func nextMessage(buf []byte, started bool) (kind byte, n int, ok bool) {
	at := 0
	if started {
		if len(buf) < 1 {
			return 0, 0, false
		}
		kind, at = buf[0], 1
	}
	if len(buf) < at+4 {
		return 0, 0, false
	}
	n = at + int(binary.BigEndian.Uint32(buf[at:]))
	return kind, n, len(buf) >= n
}

// frontend forwards client to server; every message is accounted for before any of the ones
// read with it is forwarded, so no answer can come in between.
func (p *tripProxy) frontend(client, server net.Conn, pending *atomic.Int64) {
	defer server.Close()
	var buf []byte
	chunk := make([]byte, 16384)
	started, composing := false, false
	for {
		n, err := client.Read(chunk)
		if err != nil {
			return
		}
		buf = append(buf, chunk[:n]...)
		ready := 0
		for {
			kind, size, ok := nextMessage(buf[ready:], started)
			if !ok {
				break
			}
			if !started { // the startup message, answered by a ReadyForQuery too
				started = true
				pending.Add(1)
				ready += size
				continue
			}
			p.mu.Lock()
			newTrip := pending.Load() == 0 && !composing && kind != 'X'
			if newTrip {
				p.trips++
			}
			if text, ok := statementText(kind, buf[ready+5:ready+size]); ok {
				p.sql = append(p.sql, text)
			}
			held := newTrip && p.holdAfter >= 0 && p.trips > p.holdAfter
			released := p.released
			p.mu.Unlock()
			// Parse, Bind, Describe and Execute wait for their Sync: one trip with it.
			composing = kind != 'Q' && kind != 'S'
			if !composing {
				pending.Add(1)
			}
			if held {
				if _, err := server.Write(buf[:ready]); err != nil {
					return
				}
				buf, ready = buf[ready:], 0
				<-released
			}
			ready += size
		}
		if _, err := server.Write(buf[:ready]); err != nil {
			return
		}
		buf = append([]byte(nil), buf[ready:]...)
	}
}

// backend forwards server to client: every ReadyForQuery answers one Query or Sync.
func backend(server, client net.Conn, pending *atomic.Int64) {
	defer client.Close()
	var buf []byte
	chunk := make([]byte, 16384)
	for {
		n, err := server.Read(chunk)
		if err != nil {
			return
		}
		buf = append(buf, chunk[:n]...)
		ready := 0
		for {
			kind, size, ok := nextMessage(buf[ready:], true)
			if !ok {
				break
			}
			if kind == 'Z' {
				pending.Add(-1)
			}
			ready += size
		}
		if _, err := client.Write(buf[:ready]); err != nil {
			return
		}
		buf = append([]byte(nil), buf[ready:]...)
	}
}

// proxiedPool is a pool of one connection through a counting proxy: every statement of a
// request goes through it, and a connection not back in the pool blocks the next request.
func proxiedPool(t *testing.T) (*pgxpool.Pool, *tripProxy) {
	t.Helper()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		t.Skip("DATABASE_URL is not set: clients/go/test.sh starts PostgreSQL with the extension")
	}
	testPool(t) // the test table
	pg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startTripProxy(t, net.JoinHostPort(pg.Host, strconv.Itoa(int(pg.Port))))
	cfg, err := ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(proxy.addr)
	p, _ := strconv.Atoi(port)
	// No TLS (the proxy reads the protocol in clear), hence no SSLRequest and no fallback.
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(testCtx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, proxy
}

// idle waits until the pool's connection is back (after a ROLLBACK sent behind the answer).
func idle(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for range 500 {
		if s := pool.Stat(); s.AcquiredConns() == 0 && s.TotalConns() == 1 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the connection did not come back to the pool: %+v", pool.Stat())
}

// counted sends one request with the round trips after the first holdAfter held (-1: none);
// the answer must come while they are held. It returns the answer and the round trips counted
// once they were let through and the connection is back in the pool.
func counted(t *testing.T, pool *pgxpool.Pool, proxy *tripProxy, url, body string, holdAfter int,
	lines ...string) (resp, int) {
	t.Helper()
	idle(t, pool)
	proxy.reset(holdAfter)
	answer := make(chan resp, 1)
	go func() { answer <- post(t, url, body, lines...) }()
	var r resp
	select {
	case r = <-answer:
	case <-time.After(10 * time.Second):
		proxy.release()
		t.Fatalf("no answer while the round trips after the first %d were held", holdAfter)
	}
	proxy.release()
	idle(t, pool)
	return r, proxy.count()
}

func TestRoundTripsSameTransaction(t *testing.T) {
	pool, proxy := proxiedPool(t)
	srv, _ := serve(t, pool, "std", Policy{}, Policy{Mode: CommittedFirst, Lease: 30 * time.Second})
	tenant := "X-Api-Key: " + uniqueName(t)
	url := srv.URL + "/charges"
	// Warm up: the pool's connection.
	if r := post(t, url, `{"amount": 1}`, tenant, key(NewToken())); r.status != 201 {
		t.Fatalf("warm-up: %v", r)
	}
	k := key(NewToken())
	fresh, trips := counted(t, pool, proxy, url, `{"amount": 5}`, -1, tenant, k)
	if fresh.status != 201 {
		t.Fatalf("fresh key: %v", fresh)
	}
	if trips != 3 {
		t.Errorf("a fresh key took %d round trips, want 3: BEGIN with the claim, the INSERT, "+
			"idem_complete with COMMIT", trips)
	}
	// The claim in the work's transaction is deferred when the extension has it (0.6.0).
	deferred, err := ClaimTakesDeferred(testCtx, testPool(t))
	if err != nil {
		t.Fatal(err)
	}
	if claims := proxy.claims(); len(claims) != 1 || strings.Contains(claims[0], "deferred => true") != deferred {
		t.Errorf("the claim statements sent: %q; want one, passing deferred => true: %v (the extension has it: %v)",
			claims, deferred, deferred)
	}
	replay, trips := counted(t, pool, proxy, url, `{"amount": 5}`, 1, tenant, k)
	if !replay.replayed() || replay.status != 201 {
		t.Fatalf("replay: %v", replay)
	}
	if trips != 2 {
		t.Errorf("a replay took %d round trips, want 2: BEGIN with the claim, the ROLLBACK after the answer", trips)
	}
	mismatch, trips := counted(t, pool, proxy, url, `{"amount": 6}`, 1, tenant, k)
	if !isProblem(mismatch, 422, slugReused) {
		t.Fatalf("mismatch: %v", mismatch)
	}
	if trips != 2 {
		t.Errorf("a mismatch took %d round trips, want 2: BEGIN with the claim, the ROLLBACK after the answer", trips)
	}
}

func TestRoundTripsCommittedFirstReplay(t *testing.T) {
	pool, proxy := proxiedPool(t)
	srv, _ := serve(t, pool, "std", Policy{}, Policy{Mode: CommittedFirst, Lease: 30 * time.Second})
	tenant := "X-Api-Key: " + uniqueName(t)
	url := srv.URL + "/charges/external"
	// Warm up: the pool's connection.
	if r := post(t, url, `{"amount": 1}`, tenant, key(NewToken())); r.status != 201 {
		t.Fatalf("warm-up: %v", r)
	}
	k := key(NewToken())
	if r, _ := counted(t, pool, proxy, url, `{"amount": 5}`, -1, tenant, k); r.status != 201 {
		t.Fatalf("first: %v", r)
	}
	// The committed claim is never deferred: it commits at once, alone.
	if claims := proxy.claims(); len(claims) != 1 || strings.Contains(claims[0], "deferred") {
		t.Errorf("the claim statements sent: %q; want one, without deferred", claims)
	}
	replay, trips := counted(t, pool, proxy, url, `{"amount": 5}`, 1, tenant, k)
	if !replay.replayed() {
		t.Fatalf("replay: %v", replay)
	}
	if trips != 1 {
		t.Errorf("a committed-first replay took %d round trips, want 1: the claim", trips)
	}
}
