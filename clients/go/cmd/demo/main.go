// The demo charges service on net/http's standard mux (the demo app contract that
// tests/e2e/run.py checks, the same in every client package):
//
//	go run ./cmd/demo --database-url postgresql://postgres@127.0.0.1:5432/postgres --listen 127.0.0.1:8080
//	    [--lease-ms N (default 10000)] [--allow-fault-injection]
//
// POST /charges claims in the charge's own transaction; POST /charges/external claims first
// (committed, lease renewed) and writes the charge in a transaction of its own, fenced by a
// checkpoint; GET /charges/{id}; GET /healthz. With --allow-fault-injection, POST
// /charges/external honours X-Fault-Delay-Ms (sleep before the side effect) and
// X-Fault-Fail-Before: 1 (fail before it).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempotency "github.com/idempotency/pg-idempotency-go"
)

const schema = `
CREATE TABLE IF NOT EXISTS charges (
    id text PRIMARY KEY, tenant text NOT NULL, amount bigint NOT NULL CHECK (amount > 0),
    currency text NOT NULL, gateway_charge_id text UNIQUE, created_at timestamptz NOT NULL DEFAULT now())`

const chargeJSON = `jsonb_build_object('id', id, 'object', 'charge', 'amount', amount, 'currency', currency,
  'gateway_charge_id', gateway_charge_id, 'status', 'succeeded', 'created_at', created_at)::text`

const insertCharge = `INSERT INTO charges (id, tenant, amount, currency)
VALUES ('ch_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3)
RETURNING id, ` + chargeJSON

const selectCharge = `SELECT ` + chargeJSON + ` FROM charges WHERE id = $1 AND tenant = $2`

func main() {
	listen := flag.String("listen", os.Getenv("LISTEN_ADDR"), "HOST:PORT to serve on (or env LISTEN_ADDR)")
	databaseURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (or env DATABASE_URL)")
	leaseMs := flag.Int("lease-ms", 10000, "the committed-first route's lease, in milliseconds (at least 100)")
	faults := flag.Bool("allow-fault-injection", false, "honour the X-Fault-* request headers")
	flag.Parse()
	if *listen == "" || *databaseURL == "" || *leaseMs < 100 {
		fmt.Fprintln(os.Stderr, "demo: give --listen HOST:PORT, --database-url URL and --lease-ms >= 100")
		flag.Usage()
		os.Exit(2)
	}
	cfg, err := idempotency.ParseConfig(*databaseURL)
	if err != nil {
		fatal("--database-url: %v", err)
	}
	cfg.MaxConns = 24
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fatal("%v", err)
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		fatal("creating the charges table: %v", err)
	}
	srv := &http.Server{Addr: *listen, Handler: newApp(pool, time.Duration(*leaseMs)*time.Millisecond, *faults)}
	fmt.Fprintf(os.Stderr, "demo (go): listening on http://%s\n", *listen)
	fatal("%v", srv.ListenAndServe())
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "demo: "+format+"\n", args...)
	os.Exit(1)
}

// newApp is the whole service: its routes on the standard mux.
func newApp(pool *pgxpool.Pool, lease time.Duration, faults bool) http.Handler {
	idem := idempotency.New(pool, idempotency.Options{Tenant: tenant, Logger: slog.Default()})
	s := &service{pool: pool, faults: faults}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("POST /charges", idem.Protect(idempotency.Policy{Mode: idempotency.SameTransaction})(
		http.HandlerFunc(s.createInTransaction)))
	mux.Handle("POST /charges/external",
		idem.Protect(idempotency.Policy{Mode: idempotency.CommittedFirst, Lease: lease})(
			http.HandlerFunc(s.createCommittedFirst)))
	mux.HandleFunc("GET /charges/{id}", s.get)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem(404, "Not found", "No such route.").WriteTo(w)
	})
	return mux
}

type service struct {
	pool   *pgxpool.Pool
	faults bool
}

func problem(status int, title, detail string) *idempotency.Problem {
	return &idempotency.Problem{Status: status, Title: title, Detail: detail}
}

// tenant is the X-Api-Key header; missing or empty: 401 before anything is claimed.
func tenant(r *http.Request) (string, error) {
	if key := r.Header.Get("X-Api-Key"); key != "" {
		return key, nil
	}
	p := problem(401, "Unauthorized", "Give your API key in the X-Api-Key header.")
	p.Headers = map[string]string{"WWW-Authenticate": `ApiKey realm="charges"`}
	return "", p
}

type chargeRequest struct {
	Amount   int64
	Currency string
}

// parseCharge accepts exactly {"amount": <integer > 0>, "currency": <non-empty string>}.
func parseCharge(r *http.Request) (chargeRequest, bool) {
	var fields map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&fields); err != nil || len(fields) != 2 {
		return chargeRequest{}, false
	}
	var c chargeRequest
	amount, err := strconv.ParseInt(string(fields["amount"]), 10, 64)
	if err != nil || amount <= 0 || amount > 1<<53-1 || json.Unmarshal(fields["currency"], &c.Currency) != nil ||
		c.Currency == "" {
		return chargeRequest{}, false
	}
	c.Amount = amount
	return c, true
}

var invalidBody = problem(400, "Invalid request", `The body must be {"amount": <integer > 0>, "currency": <string>}.`)

func created(w http.ResponseWriter, id, charge string) {
	w.Header().Set("Location", "/charges/"+id)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(charge))
}

func failed(w http.ResponseWriter, err error) {
	slog.Error("demo: request failed", "err", err)
	problem(500, "Internal server error", "The request failed.").WriteTo(w)
}

// POST /charges: the charge row and the stored response commit with the claim.
func (s *service) createInTransaction(w http.ResponseWriter, r *http.Request) {
	body, ok := parseCharge(r)
	if !ok {
		invalidBody.WriteTo(w) // 400: the transaction rolls back, the key stays free
		return
	}
	h := idempotency.FromRequest(r)
	tenantID, _ := tenant(r)
	var id, charge string
	if err := h.Tx().QueryRow(r.Context(), insertCharge, tenantID, body.Amount, body.Currency).Scan(&id, &charge); err != nil {
		failed(w, err)
		return
	}
	created(w, id, charge)
}

// POST /charges/external: the claim committed first; the charge row is written in a
// transaction of its own, fenced by the checkpoint that records its id.
func (s *service) createCommittedFirst(w http.ResponseWriter, r *http.Request) {
	body, ok := parseCharge(r)
	if !ok {
		invalidBody.WriteTo(w) // 400: the key is given back
		return
	}
	ctx := r.Context()
	h := idempotency.FromRequest(r)
	tenantID, _ := tenant(r)
	if h.RecoveryPoint == "charged" {
		// An earlier attempt wrote the charge and died before completing: answer with it.
		var done struct{ ID string }
		var charge string
		err := json.Unmarshal(h.RecoveryData, &done)
		if err == nil {
			err = s.pool.QueryRow(ctx, selectCharge, done.ID, tenantID).Scan(&charge)
		}
		if err != nil {
			failed(w, err)
			return
		}
		created(w, done.ID, charge)
		return
	}
	if s.faults {
		if ms, _ := strconv.Atoi(r.Header.Get("X-Fault-Delay-Ms")); ms > 0 {
			select {
			case <-time.After(time.Duration(ms) * time.Millisecond):
			case <-ctx.Done(): // the claim was lost meanwhile
				failed(w, context.Cause(ctx))
				return
			}
		}
		if r.Header.Get("X-Fault-Fail-Before") == "1" {
			failed(w, errors.New("fault injected before the side effect"))
			return
		}
	}
	var id, charge string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, insertCharge, tenantID, body.Amount, body.Currency).Scan(&id, &charge); err != nil {
			return err
		}
		return h.Checkpoint(ctx, tx, "charged", map[string]string{"id": id})
	})
	if err != nil {
		failed(w, err)
		return
	}
	created(w, id, charge)
}

// GET /charges/{id}: the tenant's charge, or 404.
func (s *service) get(w http.ResponseWriter, r *http.Request) {
	tenantID, err := tenant(r)
	if err != nil {
		err.(*idempotency.Problem).WriteTo(w)
		return
	}
	var charge string
	err = s.pool.QueryRow(r.Context(), selectCharge, r.PathValue("id"), tenantID).Scan(&charge)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		problem(404, "Not found", "No such charge.").WriteTo(w)
	case err != nil:
		failed(w, err)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(charge))
	}
}
