// Package idempotency is the Go client of the idempotency PostgreSQL extension (pgx v5): one
// function per SQL function of the contract, typed outcomes and errors, and net/http middleware
// that handles the Idempotency-Key header (standard library mux and chi alike).
package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier is what the client runs its statements on: a *pgxpool.Pool, a pgx.Tx, a *pgx.Conn
// or a *pgxpool.Conn.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Every statement runs in pgx's exec mode: an unnamed prepared statement, parsed, bound and
// run in one round trip, so it works through PgBouncer in transaction mode whatever the pool's
// own default mode is.
const execMode = pgx.QueryExecModeExec

// ParseConfig is pgxpool.ParseConfig with the pool's default query mode set to exec mode, so
// that the application's own statements also work through PgBouncer in transaction mode.
func ParseConfig(databaseURL string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	return cfg, nil
}

// Outcome is idem_claim's answer.
type Outcome string

const (
	Claimed    Outcome = "claimed"
	Reclaimed  Outcome = "reclaimed"
	Replay     Outcome = "replay"
	InProgress Outcome = "in_progress"
	Mismatch   Outcome = "mismatch"
	Expired    Outcome = "expired"
)

// Owned reports whether the caller now owns the claim (claimed or reclaimed) and must run the
// operation.
func (o Outcome) Owned() bool { return o == Claimed || o == Reclaimed }

func parseOutcome(s string) (Outcome, error) {
	switch o := Outcome(s); o {
	case Claimed, Reclaimed, Replay, InProgress, Mismatch, Expired:
		return o, nil
	}
	return "", fmt.Errorf("idempotency: unknown claim outcome %q", s)
}

// ClaimOptions are idem_claim's optional arguments. Zero values mean "not given" (the
// extension's defaults). The fingerprint is Fingerprint when set; else idem_fingerprint of
// JSON (jsonb, without the top-level fields in Ignore) when set; else of Bytes (bytea) when
// set; else NULL. Computing it inside the claim statement costs no extra round trip.
type ClaimOptions struct {
	Fingerprint string
	JSON        []byte
	Ignore      []string
	Bytes       []byte
	TTL         time.Duration
	Lease       time.Duration
	Wait        time.Duration // a duplicate waits this long for the owner (extension 0.4.0)
	Token       string        // a fresh random UUID per attempt (NewToken), so a broken claim can be repeated
	// Deferred (extension 0.6.0): a claim made in the same transaction as the work and its
	// Complete writes nothing until Complete writes the completed record; a COMMIT without a
	// Complete writes the in_progress record (docs/reference.md, idem_claim's deferred).
	// ClaimTakesDeferred tells whether the installed extension has it.
	Deferred bool
}

// Claim is idem_claim's result row.
type Claim struct {
	Outcome         Outcome
	Token           string // set when Outcome.Owned()
	HTTPStatus      int    // 0 when NULL
	ResponseStatus  int
	ResponseHeaders map[string]string
	ResponseBody    []byte // the stored body as jsonb prints it; nil when none
	RecoveryPoint   string
	RecoveryData    json.RawMessage // nil when none
	Attempts        int
	ExpiresAt       time.Time
	LockedUntil     *time.Time
	RetryAfter      int // in_progress: whole seconds until the owner's lease ends (server clock), at least 1
}

// claimSQL is idem_claim's statement; deferred adds deferred => true (extension 0.6.0).
func claimSQL(deferred bool) string {
	if deferred {
		return claimDeferredSQL
	}
	return claimNowSQL
}

const claimColumns = `
SELECT c.outcome, c.token::text, c.http_status, c.response_status, c.response_headers::text,
       c.response_body::text, c.recovery_point, c.recovery_data::text, c.attempts, c.expires_at,
       c.locked_until,
       CASE WHEN c.outcome = 'in_progress' AND c.locked_until IS NOT NULL
            THEN greatest(1, ceil(extract(epoch FROM c.locked_until - clock_timestamp())))::int END
FROM idempotency.idem_claim($1::text, $2::text,
       coalesce($3::text, idempotency.idem_fingerprint($4::text::jsonb, $5::text[]),
                idempotency.idem_fingerprint($6::bytea)),
       ttl => $7::interval, lease => $8::interval, wait => $9::interval, token => $10::uuid`

const (
	claimNowSQL      = claimColumns + `) AS c`
	claimDeferredSQL = claimColumns + `, deferred => true) AS c`
)

// ClaimKey runs idem_claim.
func ClaimKey(ctx context.Context, db Querier, scope, key string, o ClaimOptions) (*Claim, error) {
	return scanClaim(db.QueryRow(ctx, claimSQL(o.Deferred), append([]any{execMode}, claimArgs(scope, key, o)...)...))
}

// ClaimTakesDeferred reports whether the installed extension's idem_claim has the deferred
// argument (0.6.0), read from pg_proc as it is: ClaimOptions.Deferred needs it.
func ClaimTakesDeferred(ctx context.Context, db Querier) (bool, error) {
	var has bool
	err := db.QueryRow(ctx, `SELECT coalesce(bool_or('deferred' = ANY (p.proargnames)), false)
		FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'idempotency' AND p.proname = 'idem_claim'`, execMode).Scan(&has)
	return has, classify(err)
}

// claimArgs are claimSQL's arguments.
func claimArgs(scope, key string, o ClaimOptions) []any {
	var jsonArg, bytesArg any
	if o.JSON != nil {
		jsonArg = string(o.JSON)
	}
	if o.Bytes != nil {
		bytesArg = o.Bytes
	}
	var ignore any
	if len(o.Ignore) > 0 {
		ignore = o.Ignore
	}
	return []any{scope, key, nullString(o.Fingerprint), jsonArg, ignore, bytesArg,
		interval(o.TTL), interval(o.Lease), interval(o.Wait), nullString(o.Token)}
}

// scanClaim reads claimSQL's row.
func scanClaim(row pgx.Row) (*Claim, error) {
	var (
		outcome                                string
		token, headers, body, point, data      *string
		httpStatus, responseStatus, retryAfter *int32
		attempts                               *int32
		expiresAt                              *time.Time
		lockedUntil                            *time.Time
	)
	err := row.Scan(&outcome, &token, &httpStatus, &responseStatus, &headers, &body, &point, &data, &attempts,
		&expiresAt, &lockedUntil, &retryAfter)
	if err != nil {
		return nil, classify(err)
	}
	c := &Claim{LockedUntil: lockedUntil}
	if c.Outcome, err = parseOutcome(outcome); err != nil {
		return nil, err
	}
	c.Token = deref(token)
	c.HTTPStatus = int(derefInt(httpStatus))
	c.ResponseStatus = int(derefInt(responseStatus))
	c.RetryAfter = int(derefInt(retryAfter))
	c.Attempts = int(derefInt(attempts))
	c.RecoveryPoint = deref(point)
	if expiresAt != nil {
		c.ExpiresAt = *expiresAt
	}
	if body != nil {
		c.ResponseBody = []byte(*body)
	}
	if data != nil {
		c.RecoveryData = json.RawMessage(*data)
	}
	if headers != nil {
		if err := json.Unmarshal([]byte(*headers), &c.ResponseHeaders); err != nil {
			return nil, fmt.Errorf("idempotency: stored response headers: %w", err)
		}
	}
	return c, nil
}

// Complete runs idem_complete: body is JSON text (stored as jsonb) or nil, headers a header
// name to value map or nil. It returns the stored body as jsonb prints it (what every replay
// sends), nil when there is none.
func Complete(ctx context.Context, db Querier, scope, key, token string, status int, body []byte,
	headers map[string]string) ([]byte, error) {
	args, err := completeArgs(scope, key, token, status, body, headers)
	if err != nil {
		return nil, err
	}
	return scanStored(db.QueryRow(ctx, completeSQL, append([]any{execMode}, args...)...))
}

const completeSQL = `SELECT $5::text::jsonb::text
	FROM idempotency.idem_complete($1::text, $2::text, $3::uuid, $4::int, $5::text::jsonb, $6::text::jsonb)`

// completeArgs are completeSQL's arguments.
func completeArgs(scope, key, token string, status int, body []byte, headers map[string]string) ([]any, error) {
	var bodyArg, headersArg any
	if body != nil {
		bodyArg = string(body)
	}
	if headers != nil {
		h, err := json.Marshal(headers)
		if err != nil {
			return nil, err
		}
		headersArg = string(h)
	}
	return []any{scope, key, token, status, bodyArg, headersArg}, nil
}

// scanStored reads completeSQL's row: the stored body as jsonb prints it, nil when none.
func scanStored(row pgx.Row) ([]byte, error) {
	var stored *string
	if err := row.Scan(&stored); err != nil {
		return nil, classify(err)
	}
	if stored == nil {
		return nil, nil
	}
	return []byte(*stored), nil
}

// Checkpoint runs idem_checkpoint: records progress (data: JSON text or nil) and renews the
// lease (0: the extension's default). It returns the new locked_until.
func Checkpoint(ctx context.Context, db Querier, scope, key, token, point string, data []byte,
	lease time.Duration) (time.Time, error) {
	var dataArg any
	if data != nil {
		dataArg = string(data)
	}
	var until time.Time
	err := db.QueryRow(ctx, `SELECT idempotency.idem_checkpoint($1::text, $2::text, $3::uuid, $4::text,
		$5::text::jsonb, $6::interval)`, execMode, scope, key, token, point, dataArg, interval(lease)).Scan(&until)
	return until, classify(err)
}

// Release runs idem_release: false when the token no longer owns a live in_progress record.
func Release(ctx context.Context, db Querier, scope, key, token string) (bool, error) {
	var released bool
	err := db.QueryRow(ctx, `SELECT idempotency.idem_release($1::text, $2::text, $3::uuid)`,
		execMode, scope, key, token).Scan(&released)
	return released, classify(err)
}

// Record is a row of idempotency.keys, as idem_lookup returns it.
type Record struct {
	Scope, Key, Fingerprint, Status, Token string
	Attempts                               int
	LockedUntil                            *time.Time
	RecoveryPoint                          string
	RecoveryData                           json.RawMessage
	ResponseStatus                         int
	ResponseHeaders                        json.RawMessage
	ResponseBody                           []byte
	ExpiresAt                              time.Time
}

// Lookup runs idem_lookup: the live record, or nil.
func Lookup(ctx context.Context, db Querier, scope, key string) (*Record, error) {
	var (
		r                                     Record
		fp, token, point, data, headers, body *string
		status                                *int32
		attempts                              int32
	)
	err := db.QueryRow(ctx, `SELECT scope, key, fingerprint, status::text, token::text, attempts, locked_until,
		recovery_point, recovery_data::text, response_status, response_headers::text, response_body::text, expires_at
		FROM idempotency.idem_lookup($1::text, $2::text)`, execMode, scope, key).Scan(
		&r.Scope, &r.Key, &fp, &r.Status, &token, &attempts, &r.LockedUntil, &point, &data, &status, &headers,
		&body, &r.ExpiresAt)
	if err == pgx.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, classify(err)
	}
	r.Fingerprint, r.Token, r.RecoveryPoint = deref(fp), deref(token), deref(point)
	r.Attempts, r.ResponseStatus = int(attempts), int(derefInt(status))
	if data != nil {
		r.RecoveryData = json.RawMessage(*data)
	}
	if headers != nil {
		r.ResponseHeaders = json.RawMessage(*headers)
	}
	if body != nil {
		r.ResponseBody = []byte(*body)
	}
	return &r, nil
}

// Seen runs idem_seen: true the first time messageID is seen in scope (recorded in the
// caller's transaction), false for a duplicate.
func Seen(ctx context.Context, db Querier, scope, messageID string, ttl time.Duration) (bool, error) {
	var first bool
	err := db.QueryRow(ctx, `SELECT idempotency.idem_seen($1::text, $2::text, $3::interval)`,
		execMode, scope, messageID, interval(ttl)).Scan(&first)
	return first, classify(err)
}

// SeenMany runs idem_seen_many: element i is true when ids[i] is seen for the first time.
func SeenMany(ctx context.Context, db Querier, scope string, ids []string, ttl time.Duration) ([]bool, error) {
	var firsts []bool
	err := db.QueryRow(ctx, `SELECT idempotency.idem_seen_many($1::text, $2::text[], $3::interval)`,
		execMode, scope, ids, interval(ttl)).Scan(&firsts)
	return firsts, classify(err)
}

// FingerprintJSON runs idem_fingerprint(jsonb, ignore) on JSON text.
func FingerprintJSON(ctx context.Context, db Querier, body []byte, ignore []string) (string, error) {
	var fp string
	var ignoreArg any
	if len(ignore) > 0 {
		ignoreArg = ignore
	}
	err := db.QueryRow(ctx, `SELECT idempotency.idem_fingerprint($1::text::jsonb, $2::text[])`,
		execMode, string(body), ignoreArg).Scan(&fp)
	return fp, classify(err)
}

// NewToken is a random UUID (version 4) for ClaimOptions.Token.
func NewToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// interval is a duration as PostgreSQL interval text; 0 is NULL (the extension's default).
func interval(d time.Duration) any {
	if d == 0 {
		return nil
	}
	return fmt.Sprintf("%d microseconds", d.Microseconds())
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func derefInt(i *int32) int32 {
	if i == nil {
		return 0
	}
	return *i
}
