package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The README's example app as a process (ORDERS_BIN, built from this folder by
// clients/go/test.sh) on a cluster of its own that the test restarts, stops and starts again
// (GO_OUTAGE_URL, its pg_ctl GO_OUTAGE_PGCTL and data folder GO_OUTAGE_DATA):
//   - the requests of the README: a fresh one, the same again (replayed), the same key with
//     another body (422 problem), an invalid order (the handler's 422: the key stays free);
//   - restarted while the app is idle: the next request succeeds;
//   - stopped while the app is busy: every answer is 201 or the 503 problem+json with
//     Retry-After, each 503 within 2 s, no other status, the app still up; every key answered
//     201 has its one row and every key answered 503 none (nothing was done);
//   - started again: the keys refused meanwhile run, once.

const bound = 2 * time.Second // the contract's "503 within 2 s"

type app struct {
	url    string
	db     string
	log    *syncBuffer
	exited chan struct{}
}

// syncBuffer is the app's output, written by exec's copying goroutine while the test reads it.
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

type answer struct {
	key    string
	status int
	header http.Header
	body   []byte
	took   time.Duration
	err    error
}

func (a answer) String() string {
	return fmt.Sprintf("%s: %d %v %s (%v, %v)", a.key, a.status, a.header, a.body, a.took, a.err)
}

// unavailable: the contract's 503 problem with Retry-After.
func (a answer) unavailable() bool {
	var p struct{ Type string }
	return a.status == 503 && a.header.Get("Content-Type") == "application/problem+json" &&
		json.Unmarshal(a.body, &p) == nil && p.Type == "urn:pg-idempotency:problem:service-unavailable" &&
		a.header.Get("Retry-After") != "" && a.header.Get("Retry-After") != "0"
}

func (a *app) post(key, body string) answer {
	req, _ := http.NewRequest("POST", a.url+"/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "acct_outage")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	start := time.Now()
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return answer{key: key, err: err, took: time.Since(start)}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{key: key, status: res.StatusCode, header: res.Header, body: b, took: time.Since(start), err: err}
}

func orderBody(item string) string { return fmt.Sprintf(`{"item": %q, "quantity": 1}`, item) }

// pgCtl runs the outage cluster's pg_ctl (the server's output to its log, not to this test).
func pgCtl(t *testing.T, args ...string) {
	t.Helper()
	if err := pgCtlCommand(args...); err != nil {
		t.Fatal(err)
	}
}

func pgCtlCommand(args ...string) error {
	data := os.Getenv("GO_OUTAGE_DATA")
	cmd := exec.Command(os.Getenv("GO_OUTAGE_PGCTL"), append([]string{"-D", data, "-w", "-l",
		filepath.Join(filepath.Dir(data), "server.log")}, args...)...)
	if os.Getuid() == 0 { // PostgreSQL does not run as root
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--"}, cmd.Args...)...)
	}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl %v: %w\n%s", args, err, out)
	}
	return nil
}

// rows is how many orders each answer's key has (the key is the order's item), read on a
// connection of its own.
func rows(t *testing.T, db string, answers []answer) map[string]int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	keys := make([]string, len(answers))
	for i, a := range answers {
		keys[i] = a.key
	}
	found, err := conn.Query(ctx, `SELECT item, count(*)::int FROM orders WHERE item = ANY ($1) GROUP BY item`, keys)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for found.Next() {
		var item string
		var count int
		if err := found.Scan(&item, &count); err != nil {
			t.Fatal(err)
		}
		n[item] = count
	}
	if err := found.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func startApp(t *testing.T) *app {
	t.Helper()
	bin, listen, db := os.Getenv("ORDERS_BIN"), os.Getenv("ORDERS_LISTEN"), os.Getenv("GO_OUTAGE_URL")
	if bin == "" || listen == "" || db == "" || os.Getenv("GO_OUTAGE_PGCTL") == "" || os.Getenv("GO_OUTAGE_DATA") == "" {
		t.Skip("ORDERS_BIN, ORDERS_LISTEN, GO_OUTAGE_URL, GO_OUTAGE_PGCTL or GO_OUTAGE_DATA is not set: " +
			"clients/go/test.sh sets them")
	}
	if pgCtlCommand("status") != nil { // stopped by a run that was cut short
		pgCtl(t, "start")
	}
	if ln, err := net.Listen("tcp", listen); err != nil {
		t.Fatalf("%s is not free (an app left running?): %v", listen, err)
	} else {
		_ = ln.Close()
	}
	a := &app{url: "http://" + listen, db: db, log: &syncBuffer{}, exited: make(chan struct{})}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db, "LISTEN_ADDR="+listen)
	cmd.Stdout, cmd.Stderr = a.log, a.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-a.exited
		if t.Failed() {
			t.Logf("the app's log:\n%s", a.log)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if res, err := http.Get(a.url + "/"); err == nil {
			res.Body.Close()
			return a
		}
		select {
		case <-a.exited:
			t.Fatalf("the app exited: %s", a.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app did not listen on %s", listen)
		}
	}
}

func TestOutageExampleApp(t *testing.T) {
	a := startApp(t)
	run := fmt.Sprint(time.Now().UnixNano())
	k := "k-" + run

	first := a.post(k, orderBody("book-"+run))
	again := a.post(k, orderBody("book-"+run))
	other := a.post(k, orderBody("pen-"+run))
	if first.status != 201 || again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" ||
		!bytes.Equal(again.body, first.body) {
		t.Errorf("a fresh request, then the same again: %v, then %v; want 201 and its replay", first, again)
	}
	if other.status != 422 || !strings.Contains(string(other.body), "idempotency-key-reused") {
		t.Errorf("the same key with another body: %v; want the 422 problem", other)
	}
	invalid := a.post("v-"+run, `{"item": "cup", "quantity": 0}`)
	corrected := a.post("v-"+run, orderBody("cup-"+run))
	if invalid.status != 422 || !strings.Contains(string(invalid.body), "Invalid order") || corrected.status != 201 ||
		corrected.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("an invalid order, then the corrected one with its key: %v, then %v; want the handler's 422, then 201",
			invalid, corrected)
	}

	pgCtl(t, "-m", "fast", "restart")
	if r := a.post("r-"+run, orderBody("lamp-"+run)); r.status != 201 {
		t.Errorf("the database restarted under the idle app, the next request: %v; want 201", r)
	}

	// Busy: 8 clients sending new keys, the database stopped under them.
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("b-%s-%d-%d", run, c, i)
				r := a.post(key, orderBody(key))
				mu.Lock()
				answers = append(answers, r)
				mu.Unlock()
				if r.status != 201 {
					time.Sleep(100 * time.Millisecond) // a client that waits a little before the next
				}
			}
		}()
	}
	time.Sleep(time.Second)
	pgCtl(t, "-m", "fast", "stop")
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()

	var created, refused []answer
	for _, r := range answers {
		switch {
		case r.status == 201:
			created = append(created, r)
		case r.unavailable() && r.took < bound:
			refused = append(refused, r)
		default:
			t.Errorf("the database stopped under the busy app: %v; want 201, or the 503 problem within %v", r, bound)
		}
	}
	if len(created) == 0 || len(refused) == 0 {
		t.Errorf("%d answers 201 and %d 503; want both (before and after the stop)", len(created), len(refused))
	}
	select {
	case <-a.exited:
		t.Fatalf("the app exited: %s", a.log)
	default:
	}

	pgCtl(t, "start")
	n := rows(t, a.db, append(append([]answer(nil), created...), refused...))
	for _, r := range created {
		if n[r.key] != 1 {
			t.Errorf("key %s answered 201: %d rows; want 1", r.key, n[r.key])
		}
	}
	for _, r := range refused {
		if n[r.key] != 0 {
			t.Errorf("key %s answered 503: %d rows; want none (503 says nothing was done)", r.key, n[r.key])
		}
	}
	retried := refused[:min(len(refused), 20)]
	for _, r := range retried {
		if again := a.post(r.key, orderBody(r.key)); again.status != 201 || again.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("started again, key %s refused meanwhile: %v; want 201, run as new", r.key, again)
		}
	}
	n = rows(t, a.db, retried)
	for _, r := range retried {
		if n[r.key] != 1 {
			t.Errorf("key %s then: %d rows; want 1", r.key, n[r.key])
		}
	}
	if strings.Contains(a.log.String(), "panic") {
		t.Errorf("a panic in the app's log:\n%s", a.log)
	}
	t.Logf("busy app, database stopped: %d answers 201, %d answered 503 (the slowest in %v)", len(created),
		len(refused), slowest(refused))
}

func slowest(answers []answer) time.Duration {
	var d time.Duration
	for _, a := range answers {
		d = max(d, a.took)
	}
	return d
}
