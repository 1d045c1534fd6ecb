package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The demo app as a real process over real HTTP: DEMO_BIN (built by clients/go/test.sh),
// listening on DEMO_LISTEN, on DATABASE_URL.

type demo struct {
	t    *testing.T
	cmd  *exec.Cmd
	base string
}

func startDemo(t *testing.T) *demo {
	t.Helper()
	bin, listen, url := os.Getenv("DEMO_BIN"), os.Getenv("DEMO_LISTEN"), os.Getenv("DATABASE_URL")
	if bin == "" || listen == "" || url == "" {
		t.Skip("DEMO_BIN, DEMO_LISTEN or DATABASE_URL is not set: clients/go/test.sh sets them")
	}
	cmd := exec.Command(bin, "--listen", listen, "--database-url", url, "--lease-ms", "1000", "--allow-fault-injection")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &demo{t: t, cmd: cmd, base: "http://" + listen}
	t.Cleanup(d.kill)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get(d.base + "/healthz"); err == nil {
			res.Body.Close()
			return d
		}
	}
	t.Fatalf("the demo app did not come up on %s", listen)
	return nil
}

func (d *demo) kill() {
	if d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		_ = d.cmd.Wait()
	}
}

type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (d *demo) do(method, path, body string, header ...string) answer {
	req, _ := http.NewRequest(method, d.base+path, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: b}
}

func unique() string { return strconv.FormatInt(time.Now().UnixNano(), 36) }

func TestDemoCharges(t *testing.T) {
	d := startDemo(t)
	tenant, key := "acct_"+unique(), `"k-`+unique()+`"`
	for _, route := range []string{"/charges", "/charges/external"} {
		first := d.do("POST", route, `{"amount": 500, "currency": "eur"}`, "X-Api-Key", tenant, "Idempotency-Key", key)
		again := d.do("POST", route, `{"currency": "eur", "amount": 500.0}`, "X-Api-Key", tenant, "Idempotency-Key", key)
		if first.status != 201 || again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" ||
			!bytes.Equal(first.body, again.body) || again.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("%s: %d %s then %d %s; want 201 and its replay", route, first.status, first.body, again.status, again.body)
		}
		got := d.do("GET", first.header.Get("Location"), "", "X-Api-Key", tenant)
		var charge struct{ ID string }
		if got.status != 200 || json.Unmarshal(got.body, &charge) != nil ||
			"/charges/"+charge.ID != first.header.Get("Location") {
			t.Errorf("%s: GET Location: %d %s", route, got.status, got.body)
		}
		if other := d.do("GET", first.header.Get("Location"), "", "X-Api-Key", tenant+"_other"); other.status != 404 {
			t.Errorf("%s: another tenant's GET: %d; want 404", route, other.status)
		}
	}
	if r := d.do("POST", "/charges", `{"amount": 5, "currency": "eur"}`, "Idempotency-Key", key); r.status != 401 ||
		r.header.Get("WWW-Authenticate") == "" {
		t.Errorf("no X-Api-Key: %d %v; want 401 with WWW-Authenticate", r.status, r.header)
	}
	k2 := `"k-` + unique() + `"`
	if r := d.do("POST", "/charges/external", `{"amount": 5, "currency": "eur"}`, "X-Api-Key", tenant,
		"Idempotency-Key", k2, "X-Fault-Fail-Before", "1"); r.status != 500 {
		t.Errorf("failing before the side effect: %d %s; want 500", r.status, r.body)
	}
	if r := d.do("POST", "/charges/external", `{"amount": 5, "currency": "eur"}`, "X-Api-Key", tenant,
		"Idempotency-Key", k2); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the same key after the failure: %d %s; want 201, run as new", r.status, r.body)
	}
}

// SIGKILL while the committed-first handler runs; after a restart the retry takes the claim
// over once the lease ends and completes once.
func TestDemoKilledMidHandler(t *testing.T) {
	d := startDemo(t)
	tenant, key := "acct_"+unique(), `"k-`+unique()+`"`
	body := `{"amount": 700, "currency": "eur"}`
	doomed := make(chan answer, 1)
	go func() {
		doomed <- d.do("POST", "/charges/external", body, "X-Api-Key", tenant, "Idempotency-Key", key,
			"X-Fault-Delay-Ms", "20000")
	}()
	time.Sleep(1500 * time.Millisecond) // claimed, and renewed past its first lease
	if dup := d.do("POST", "/charges/external", body, "X-Api-Key", tenant, "Idempotency-Key", key); dup.status != 409 {
		t.Errorf("a duplicate while the first runs: %d; want 409", dup.status)
	}
	d.kill()
	if r := <-doomed; r.err == nil {
		t.Errorf("the killed request got an answer: %d", r.status)
	}
	d = startDemo(t)
	var r answer
	n409 := 0
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if r = d.do("POST", "/charges/external", body, "X-Api-Key", tenant, "Idempotency-Key", key); r.status != 409 {
			break
		}
		n409++
	}
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the retry after restart (after %d 409s): %d %s; want 201, not a replay", n409, r.status, r.body)
	}
	conn, err := pgx.Connect(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var charges, attempts int
	err = conn.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM charges WHERE tenant = $1),
		(SELECT attempts FROM idempotency.idem_lookup($1 || ':POST /charges/external', $2))`,
		pgx.QueryExecModeExec, tenant, strings.Trim(key, `"`)).Scan(&charges, &attempts)
	if err != nil || charges != 1 || attempts != 2 {
		t.Errorf("%d charges, %d attempts (%v); want one charge, completed by the second claim", charges, attempts, err)
	}
}
