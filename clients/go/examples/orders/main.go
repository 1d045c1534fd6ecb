// The README's example app: POST /orders made idempotent with chi and a pgx pool.
//
//	DATABASE_URL=postgresql://app@localhost/app go run .
//
// The database needs CREATE EXTENSION idempotency; the app creates its table. It listens on
// LISTEN_ADDR (default 127.0.0.1:8080).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempotency "github.com/idempotency/pg-idempotency-go"
)

func main() {
	ctx := context.Background()
	// ParseConfig is pgxpool.ParseConfig with the statements in exec mode, which PgBouncer in
	// transaction mode can carry (harmless without PgBouncer).
	cfg, err := idempotency.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY,
		tenant text NOT NULL, item text NOT NULL, quantity int NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	idem := idempotency.New(pool, idempotency.Options{
		Tenant: tenantOf,
		// With chi the route template ("/orders") is chi's, for the scope of each key.
		Route: func(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() },
	})
	r := chi.NewRouter()
	r.With(idem.Protect(idempotency.Policy{})).Post("/orders", createOrder)

	addr := os.Getenv("LISTEN_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	srv := &http.Server{Addr: addr, Handler: r, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("listening on http://%s", addr)
	log.Fatal(srv.ListenAndServe())
}

// tenantOf says whose keys these are (one caller's key never answers another's): the API key
// here. A *idempotency.Problem as the error is the answer, before anything is claimed.
func tenantOf(r *http.Request) (string, error) {
	if apiKey := r.Header.Get("X-Api-Key"); apiKey != "" {
		return apiKey, nil
	}
	return "", &idempotency.Problem{Status: http.StatusUnauthorized, Title: "Unauthorized",
		Detail: "Send your API key in X-Api-Key.", Headers: map[string]string{"WWW-Authenticate": "ApiKey"}}
}

type order struct {
	ID       int64  `json:"id"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

func createOrder(w http.ResponseWriter, r *http.Request) {
	var o order
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.Item == "" || o.Quantity <= 0 {
		// 422 is one of idempotency.RefusedStatuses: the key stays free for the corrected request.
		(&idempotency.Problem{Status: http.StatusUnprocessableEntity, Title: "Invalid order",
			Detail: "Give an item and a quantity above 0."}).WriteTo(w)
		return
	}
	// The key is claimed. Tx() is the claim's transaction: the row and the stored answer
	// commit together, once the answer is stored.
	tenant, _ := tenantOf(r)
	err := idempotency.FromRequest(r).Tx().QueryRow(r.Context(),
		`INSERT INTO orders (tenant, item, quantity) VALUES ($1, $2, $3) RETURNING id`,
		tenant, o.Item, o.Quantity).Scan(&o.ID)
	if err != nil {
		// The middleware answers 503 instead when the database went away (nothing committed).
		log.Printf("storing an order: %v", err)
		http.Error(w, "the order could not be stored", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", o.ID))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(o)
}
