// bench/http.sh's Go (net/http) app: POST /charges inserts one row and answers 201 with it.
//
//	MIDDLEWARE=on|off DATABASE_URL=... POOL_SIZE=N LISTEN_ADDR=127.0.0.1:PORT go run .
//
// With MIDDLEWARE=on the route is protected by pg-idempotency-go's middleware (same
// transaction: the row and the stored answer commit together); off, the same handler inserts
// through the same pool. Nothing else differs.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	idempotency "github.com/idempotency/pg-idempotency-go"
)

const insert = "INSERT INTO charges (amount, currency) VALUES ($1, $2) RETURNING id"

type charge struct {
	ID       int64  `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func main() {
	protected := map[string]bool{"on": true, "off": false}
	on, known := protected[os.Getenv("MIDDLEWARE")]
	if !known {
		log.Fatal("MIDDLEWARE must be on or off")
	}
	poolSize := 16
	if s := os.Getenv("POOL_SIZE"); s != "" {
		var err error
		if poolSize, err = strconv.Atoi(s); err != nil {
			log.Fatalf("POOL_SIZE: %v", err)
		}
	}
	config, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatalf("DATABASE_URL: %v", err)
	}
	config.MaxConns, config.MinConns = int32(poolSize), int32(poolSize)
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		log.Fatal(err)
	}

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c charge
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			http.Error(w, "the body is not JSON", http.StatusBadRequest)
			return
		}
		var row interface{ Scan(...any) error }
		if on {
			row = idempotency.FromRequest(r).Tx().QueryRow(r.Context(), insert, c.Amount, c.Currency)
		} else {
			row = pool.QueryRow(r.Context(), insert, c.Amount, c.Currency)
		}
		if err := row.Scan(&c.ID); err != nil {
			http.Error(w, fmt.Sprintf("insert: %v", err), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(c)
	})
	mux := http.NewServeMux()
	if on {
		mux.Handle("POST /charges", idempotency.New(pool, idempotency.Options{}).Protect(idempotency.Policy{})(handler))
	} else {
		mux.Handle("POST /charges", handler)
	}
	log.Fatal(http.ListenAndServe(os.Getenv("LISTEN_ADDR"), mux))
}
