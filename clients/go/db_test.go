package idempotency

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The tests below this file's helpers run against a real PostgreSQL with the extension:
// DATABASE_URL (clients/go/test.sh starts one, and runs them again through PgBouncer).

var (
	sharedPool   *pgxpool.Pool
	sharedErr    error
	sharedOnce   sync.Once
	testCtx      = context.Background()
	chargesTable = `CREATE TABLE IF NOT EXISTS go_test_charges (
		id bigserial PRIMARY KEY, scope text NOT NULL, amount bigint NOT NULL)`
)

func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		t.Skip("DATABASE_URL is not set: clients/go/test.sh starts PostgreSQL with the extension")
	}
	sharedOnce.Do(func() {
		cfg, err := ParseConfig(url)
		if err != nil {
			sharedErr = err
			return
		}
		cfg.MaxConns = 40
		if sharedPool, err = pgxpool.NewWithConfig(testCtx, cfg); err != nil {
			sharedErr = err
			return
		}
		_, sharedErr = sharedPool.Exec(testCtx, chargesTable)
	})
	if sharedErr != nil {
		t.Fatalf("database: %v", sharedErr)
	}
	return sharedPool
}

// uniqueName is a name no other test (or earlier run) uses: a scope, a tenant.
func uniqueName(t *testing.T) string {
	return strings.ReplaceAll(t.Name(), "/", "_") + "-" + NewToken()[:8]
}

func mustExec(t *testing.T, db Querier, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(testCtx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func countRows(t *testing.T, db Querier, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(testCtx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
