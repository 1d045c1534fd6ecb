// The idempotency extension from Go (pgx v5).
//
//	DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres go run .
//
// clients/go/test.sh runs it against a throwaway cluster. For HTTP services, the package in
// clients/go does all of this (and more) as net/http middleware.
//
// Runs, and checks, one claim / business write / complete / replay / mismatch cycle and a
// message consumer's idem_seen. The database needs `CREATE EXTENSION idempotency`. The last
// line is "go: N passed, M failed".
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"reflect"

	"github.com/jackc/pgx/v5"
)

const scope = "acct_42:POST /orders"

type order struct {
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

// createOrder is the usual way: claim, business write and stored response in one
// transaction. It returns the outcome, the HTTP status and the response body (JSON).
func createOrder(ctx context.Context, db *pgx.Conn, key string, body order) (string, int, []byte, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", 0, nil, err
	}
	defer tx.Rollback(ctx) // no-op after Commit

	payload, _ := json.Marshal(body)
	var outcome string
	var token *string
	var httpStatus *int
	var stored []byte
	err = tx.QueryRow(ctx, `
		SELECT outcome, token::text, http_status, response_body::text
		  FROM idempotency.idem_claim($1, $2, idempotency.idem_fingerprint($3::text::jsonb))`,
		scope, key, string(payload)).Scan(&outcome, &token, &httpStatus, &stored)
	if err != nil {
		return "", 0, nil, err
	}
	if outcome != "claimed" && outcome != "reclaimed" {
		// replay: the stored 201 and body; in_progress: 409; mismatch: 422. Nothing was written.
		return outcome, *httpStatus, stored, nil
	}
	var orderID int64
	if err = tx.QueryRow(ctx, "INSERT INTO example_orders (item, qty) VALUES ($1, $2) RETURNING id",
		body.Item, body.Qty).Scan(&orderID); err != nil {
		return "", 0, nil, err
	}
	response, _ := json.Marshal(map[string]any{"order_id": orderID, "item": body.Item, "qty": body.Qty})
	headers, _ := json.Marshal(map[string]string{"Location": fmt.Sprintf("/orders/%d", orderID)})
	if _, err = tx.Exec(ctx, "SELECT idempotency.idem_complete($1, $2, $3::text::uuid, 201, $4::text::jsonb, $5::text::jsonb)",
		scope, key, *token, string(response), string(headers)); err != nil {
		return "", 0, nil, err
	}
	return outcome, 201, response, tx.Commit(ctx)
}

// consume is an at-least-once consumer: the de-duplication and the work commit together.
func consume(ctx context.Context, db *pgx.Conn, messageID string, body order) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	var first bool
	if err = tx.QueryRow(ctx, "SELECT idempotency.idem_seen('orders-consumer', $1)", messageID).Scan(&first); err != nil {
		return false, err
	}
	if first {
		if _, err = tx.Exec(ctx, "INSERT INTO example_orders (item, qty) VALUES ($1, $2)", body.Item, body.Qty); err != nil {
			return false, err
		}
	}
	return first, tx.Commit(ctx)
}

var passed, failed int

func check(name string, ok bool, detail ...any) {
	if ok {
		passed++
		fmt.Println("ok   " + name)
	} else {
		failed++
		fmt.Println("FAIL "+name+":", fmt.Sprint(detail...))
	}
}

func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

func run(ctx context.Context) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		fmt.Fprintln(os.Stderr, "set DATABASE_URL, e.g. postgresql://postgres@127.0.0.1:5432/postgres")
		os.Exit(2)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer db.Close(ctx)
	if _, err = db.Exec(ctx, "CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, item text, qty int)"); err != nil {
		return err
	}
	random := make([]byte, 16)
	if _, err = rand.Read(random); err != nil {
		return err
	}
	key := "go-" + hex.EncodeToString(random) // made once per business operation, outside any retry loop
	body := order{Item: "book", Qty: 2}

	outcome, status, first, err := createOrder(ctx, db, key, body)
	if err != nil {
		return err
	}
	check("claim: claimed, the order is written, 201", outcome == "claimed" && status == 201, outcome, status)

	outcome, status, again, err := createOrder(ctx, db, key, body)
	if err != nil {
		return err
	}
	check("same key again: replay of the stored 201 and body",
		outcome == "replay" && status == 201 && sameJSON(again, first), outcome, status, string(again))

	outcome, status, _, err = createOrder(ctx, db, key, order{Item: "book", Qty: 3})
	if err != nil {
		return err
	}
	check("same key, another body: mismatch, 422", outcome == "mismatch" && status == 422, outcome, status)

	var created struct {
		OrderID int64 `json:"order_id"`
	}
	_ = json.Unmarshal(first, &created)
	var n int
	if err = db.QueryRow(ctx, "SELECT count(*) FROM example_orders WHERE id = $1", created.OrderID).Scan(&n); err != nil {
		return err
	}
	check("one order written", n == 1, n)

	messageID := "msg-" + key
	seen, err := consume(ctx, db, messageID, body)
	if err != nil {
		return err
	}
	check("idem_seen, first delivery: true", seen)
	seen, err = consume(ctx, db, messageID, body)
	if err != nil {
		return err
	}
	check("idem_seen, redelivery: false", !seen)
	return nil
}

func main() {
	if err := run(context.Background()); err != nil {
		check("the example ran to the end", false, err)
	}
	fmt.Printf("go: %d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
