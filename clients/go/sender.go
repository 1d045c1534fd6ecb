package idempotency

// The sending side (docs/sending.md): a request to another service with an Idempotency-Key
// made once per business operation and kept in your database. Prepare runs in your
// transaction; a Sender delivers right after COMMIT (one attempt) or runs as a worker
// (retries with backoff, jitter and the retry budget, all decided by the extension). Each
// attempt is bounded in total (connect, send, the whole answer) by the sender's Timeout, and
// the worker outlives its database: on any database error it logs, waits and goes on.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SendChannel is the channel idem_send notifies (at COMMIT) and Sender.Run listens on.
const SendChannel = "idempotency_send"

// Prepared is the row idem_send recorded (or found: the same operation prepared before).
type Prepared struct {
	Key           string
	State         string // pending, sending, done, gave_up
	Attempts      int
	NextAttemptAt time.Time
	Response      *Delivered // the final answer when State is done
}

// PrepareOptions are idem_send's optional arguments; zero values are the extension's defaults.
type PrepareOptions struct {
	Key         string        // default: a new random UUID
	GiveUpAfter time.Duration // default: idempotency.send_give_up_after (23 hours)
}

// Result is what a send came to: Delivered, NotYet, Unknown or Lost.
type Result interface{ sendResult() }

// Delivered is the receiver's final answer (any status that is not retried, 4xx included).
type Delivered struct {
	Status  int
	Headers map[string]string // lower-case names
	Body    []byte            // nil when none
}

// NotYet: no final answer yet. State pending (a retry is due at NextAttemptAt) or sending
// (another sender holds it now). A worker finishes it.
type NotYet struct {
	State         string
	Attempts      int
	NextAttemptAt time.Time
	LastStatus    int    // 0: none, or no answer
	LastError     string // why there was no answer
}

// Unknown: gave_up, no final answer came before give_up_at. The receiver may or may not have
// done the work: look it up there by Key; never send the operation again with a new key.
type Unknown struct {
	Key        string
	Attempts   int
	LastStatus int
	LastError  string
}

// Lost: this sender's lease ended and another sender took the send over (IK002). Its result
// was not recorded; the other sender's will be.
type Lost struct {
	Scope, Operation string
}

func (Delivered) sendResult() {}
func (NotYet) sendResult()    {}
func (Unknown) sendResult()   {}
func (Lost) sendResult()      {}

// Attempt is one send handed out by idem_send_next.
type Attempt struct {
	Scope, Operation, Target, Key string
	Request                       json.RawMessage // nil when NULL
	Number                        int             // 1 for the first attempt
	Token                         string
	LockedUntil, GiveUpAt         time.Time
}

// Answer is what one HTTP attempt got. Status 0 means no answer (Error says why).
type Answer struct {
	Status  int
	Headers map[string]string // lower-case names
	Body    []byte
	Error   string
}

// KeyHeader is the Idempotency-Key header's value: an RFC 8941 sf-string.
func KeyHeader(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// ParseRetryAfter reads Retry-After as delta-seconds or an HTTP date (a date in the past is 0);
// ok is false when the value is empty or unreadable.
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if strings.Trim(value, "0123456789") == "" {
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n > math.MaxInt64/int64(time.Second) {
			n = math.MaxInt64 / int64(time.Second) // far past any give_up_at
		}
		return time.Duration(n) * time.Second, true
	}
	when, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(when.Sub(now), 0), true
}

const sendSQL = `
SELECT key, state, attempts, next_attempt_at, response_status, response_body, response_headers::text
FROM idempotency.idem_send($1::text, $2::text, $3::text, $4::text::jsonb, $5::text, $6::interval)`

// Prepare records the send in the caller's open transaction (tx; it never commits) and
// returns its key. request is sent as JSON (encoding/json: JSON text goes as a
// json.RawMessage, not a []byte; nil is NULL). The same operation again returns the same
// row; with another request, target or key it fails with ErrOperationReused (IK004) and writes nothing.
func Prepare(ctx context.Context, tx Querier, scope, operation, target string, request any,
	o PrepareOptions) (Prepared, error) {
	var requestArg any
	if request != nil {
		b, err := json.Marshal(request)
		if err != nil {
			return Prepared{}, fmt.Errorf("idempotency: the request: %w", err)
		}
		requestArg = string(b)
	}
	var (
		p       Prepared
		status  *int32
		body    *string
		headers *string
	)
	err := tx.QueryRow(ctx, sendSQL, execMode, scope, operation, target, requestArg, nullString(o.Key),
		interval(o.GiveUpAfter)).Scan(&p.Key, &p.State, &p.Attempts, &p.NextAttemptAt, &status, &body, &headers)
	if err != nil {
		return Prepared{}, classify(err)
	}
	if p.State == "done" {
		d, err := delivered(status, body, headers)
		if err != nil {
			return Prepared{}, err
		}
		p.Response = &d
	}
	return p, nil
}

func delivered(status *int32, body, headers *string) (Delivered, error) {
	d := Delivered{Status: int(derefInt(status)), Headers: map[string]string{}}
	if body != nil {
		d.Body = []byte(*body)
	}
	if headers != nil {
		if err := json.Unmarshal([]byte(*headers), &d.Headers); err != nil {
			return Delivered{}, fmt.Errorf("idempotency: stored response headers: %w", err)
		}
	}
	return d, nil
}

// SenderOptions are a Sender's settings. Give URLs or Send.
type SenderOptions struct {
	// URLs maps a target to the URL its requests are POSTed to (the request as JSON, with
	// Idempotency-Key and the target's Headers, e.g. its credentials).
	URLs    map[string]string
	Headers map[string]map[string]string
	// Send replaces the HTTP: one attempt, its Answer (Status 0 and Error for no answer).
	// ctx ends after Timeout (sooner if less of the lease is left): keep within it.
	Send func(ctx context.Context, a Attempt) Answer
	// Timeout bounds one attempt in total (default 10 s): connecting, sending and reading the
	// whole answer end by one deadline, however slowly the receiver answers. It must be below
	// Lease (default 30 s), the time a sender holds a send before another may take it over:
	// NewSender refuses anything else.
	Timeout, Lease time.Duration
	Concurrency    int           // sends attempted at once by RunOnce (default 4)
	PollInterval   time.Duration // Run's longest wait without a NOTIFY (default 1 s)
	// This sender's own values of the extension's settings, the database's when nil or 0:
	// RetryBudget (idempotency.send_retry_budget, 0 to MaxRetryBudget), BackoffBase and
	// BackoffCap (idempotency.send_backoff_base / _cap) are set with set_config(..., true) in
	// the transaction of each idem_send_next and idem_send_result the sender runs (so they hold
	// through PgBouncer in transaction mode, and no other transaction sees them); GiveUpAfter
	// (idempotency.send_give_up_after) is given to idem_send by Sender.Prepare.
	RetryBudget             *float64
	BackoffBase, BackoffCap time.Duration
	GiveUpAfter             time.Duration
	// ReconnectBase and ReconnectCap bound Run's wait after a database error (defaults 100 ms
	// and 5 s): anywhere from 0 to min(ReconnectCap, ReconnectBase * 2^(n - 1)) after the n-th
	// error in a row.
	ReconnectBase, ReconnectCap time.Duration
	// Logger gets the worker's database errors (Warn, message LogDBError) and its
	// reconnections (Info, LogDBReconnected). Default: slog.Default() when it logs.
	Logger *slog.Logger
	// OnAttempt is called after each attempt, OnFinished when an attempt's result finished
	// the send (Delivered, or Unknown at that result). Both may be called from several
	// goroutines at once. A send whose give_up_at passes while it waits for its retry is
	// marked gave_up by idem_send_next without an attempt: Status tells.
	OnAttempt  func(Attempt, Answer)
	OnFinished func(Attempt, Result)
}

// The worker's log messages (SenderOptions.Logger). LogDBError (Warn) has the attributes
// "code" (the SQLSTATE, or the error's class when the server sent none: ConnectError,
// ConnectionLost, Timeout), "error" (the error) and "retry_in" (the wait before reconnecting);
// LogDBReconnected (Info) comes when the database answers again.
const (
	LogDBError       = "idempotency sender: database error"
	LogDBReconnected = "idempotency sender: reconnected to the database"
)

// Sender sends due requests: Deliver (one operation, right after COMMIT) and Run (a worker).
// Its statements run on the pool; Run's LISTEN has a session of its own (not through
// PgBouncer's transaction pooling).
type Sender struct {
	pool     *pgxpool.Pool
	o        SenderOptions
	http     *http.Client
	settings []any // set_config's arguments: name, value, ...

	mu         sync.Mutex
	unrecorded []unrecorded // answers a database error kept from being recorded
}

// unrecorded is an attempt's answer that the database went away before recording; leaseEnd is
// at or before the end of the attempt's lease.
type unrecorded struct {
	attempt  Attempt
	answer   Answer
	leaseEnd time.Time
}

// NewSender checks the options and fills in their defaults. It refuses a Timeout not below
// the Lease, and settings the extension would refuse.
func NewSender(pool *pgxpool.Pool, o SenderOptions) (*Sender, error) {
	if o.Send == nil && len(o.URLs) == 0 {
		return nil, errors.New("idempotency: give URLs (a URL per target) or Send (a function)")
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Lease == 0 {
		o.Lease = 30 * time.Second
	}
	if err := checkTimeout(o.Timeout, o.Lease); err != nil {
		return nil, err
	}
	settings, err := settingValues(o.RetryBudget, o.BackoffBase, o.BackoffCap)
	if err != nil {
		return nil, err
	}
	if err := checkOptional("GiveUpAfter", o.GiveUpAfter); err != nil {
		return nil, err
	}
	if o.ReconnectBase < 0 || o.ReconnectCap < 0 {
		return nil, errors.New("idempotency: ReconnectBase and ReconnectCap must not be negative")
	}
	if o.ReconnectBase == 0 {
		o.ReconnectBase = 100 * time.Millisecond
	}
	if o.ReconnectCap == 0 {
		o.ReconnectCap = 5 * time.Second
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	// A redirect is the receiver's answer (as with httpx): following it would turn the POST
	// into a GET without its body.
	s := &Sender{pool: pool, o: o, http: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
	for _, v := range settings {
		s.settings = append(s.settings, v.name, v.value)
	}
	if s.o.Send == nil {
		s.o.Send = s.httpSend
	}
	return s, nil
}

// Prepare is the package's Prepare with this sender's GiveUpAfter when o gives none.
func (s *Sender) Prepare(ctx context.Context, tx Querier, scope, operation, target string, request any,
	o PrepareOptions) (Prepared, error) {
	if o.GiveUpAfter == 0 {
		o.GiveUpAfter = s.o.GiveUpAfter
	}
	return Prepare(ctx, tx, scope, operation, target, request, o)
}

// sendDB is the pool, or a transaction of it.
type sendDB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// call runs f, one call of the extension, with this sender's settings: in a transaction of its
// own that sets them first when there are any.
func (s *Sender) call(ctx context.Context, f func(db sendDB) error) error {
	if len(s.settings) == 0 {
		return f(s.pool)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setConfigSQL(len(s.settings)/2), append([]any{execMode}, s.settings...)...); err != nil {
			return err
		}
		return f(tx)
	})
}

func (s *Sender) logger() *slog.Logger {
	if s.o.Logger != nil {
		return s.o.Logger
	}
	return slog.Default()
}

func (s *Sender) httpSend(ctx context.Context, a Attempt) Answer {
	url, ok := s.o.URLs[a.Target]
	if !ok {
		return Answer{Error: fmt.Sprintf("no URL for target %q", a.Target)}
	}
	body := []byte(a.Request)
	if body == nil {
		body = []byte("null")
	}
	// A body without GetBody: net/http would otherwise resend a request that carries an
	// Idempotency-Key on its own, and one attempt would be two requests.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, io.NopCloser(bytes.NewReader(body)))
	if err != nil {
		return Answer{Error: "bad URL: " + err.Error()}
	}
	req.ContentLength = int64(len(body))
	for k, v := range s.o.Headers[a.Target] {
		req.Header.Set(k, v)
	}
	req.Header.Set("Idempotency-Key", KeyHeader(a.Key))
	req.Header.Set("Content-Type", "application/json")
	// ctx's deadline bounds the whole exchange: net/http ends the connection, and a read of
	// the body, when it passes.
	resp, err := s.http.Do(req)
	if err == nil {
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
	}
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return Answer{Error: "timed out"}
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return Answer{Error: "connection failed: " + opErr.Err.Error()}
	default:
		return Answer{Error: "no answer: " + err.Error()}
	}
	headers := make(map[string]string, len(resp.Header))
	for k, v := range resp.Header {
		headers[strings.ToLower(k)] = strings.Join(v, ", ")
	}
	return Answer{Status: resp.StatusCode, Headers: headers, Body: body}
}

// attempt makes one attempt of a send this sender holds and records its result. Both run to
// the end whatever becomes of ctx: a send left held waits for its lease to end. leaseEnd is at
// or before the end of the send's lease: the attempt ends by then too.
func (s *Sender) attempt(ctx context.Context, a Attempt, leaseEnd time.Time) (Result, error) {
	ctx = context.WithoutCancel(ctx)
	answer := s.answer(ctx, a, leaseEnd)
	return s.record(ctx, a, answer)
}

// keep keeps answers the database failed to record (answers[i] is taken[i]'s), for Run to
// record once it has reconnected, while their lease holds. One that was recorded after all
// (before the error, or by the COMMIT whose reply was lost) is found recorded then (IK003).
func (s *Sender) keep(taken []Attempt, answers []Answer, leaseEnd time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.unrecorded[:0]
	for _, u := range s.unrecorded { // those past their lease would never be recorded
		if time.Now().Before(u.leaseEnd) {
			kept = append(kept, u)
		}
	}
	for i, a := range taken {
		kept = append(kept, unrecorded{a, answers[i], leaseEnd})
	}
	s.unrecorded = kept
}

func (s *Sender) answer(ctx context.Context, a Attempt, leaseEnd time.Time) Answer {
	answer := s.send(ctx, a, leaseEnd)
	if answer.Headers == nil {
		answer.Headers = map[string]string{}
	}
	if s.o.OnAttempt != nil {
		s.o.OnAttempt(a, answer)
	}
	return answer
}

func (s *Sender) send(ctx context.Context, a Attempt, leaseEnd time.Time) (answer Answer) {
	deadline := time.Now().Add(s.o.Timeout)
	if leaseEnd.Before(deadline) {
		deadline = leaseEnd
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer func() {
		if p := recover(); p != nil { // the application's own Send failed: no answer
			answer = Answer{Error: fmt.Sprintf("panic: %v", p)}
		}
	}()
	return s.o.Send(ctx, a)
}

const resultSQL = `
SELECT state, attempts, next_attempt_at
FROM idempotency.idem_send_result($1::text, $2::text, $3::uuid, $4::int, $5::text, $6::text::jsonb,
       $7::interval, $8::text)`

// resultArgs are idem_send_result's arguments after the scope, operation and token, as text
// (nil: NULL): the status, the body, the headers as JSON, Retry-After as an interval, the error.
func resultArgs(answer Answer) ([5]*string, error) {
	var v [5]*string
	text := func(t string) *string { return &t }
	if answer.Status != 0 {
		v[0] = text(strconv.Itoa(answer.Status))
		headers := answer.Headers
		if headers == nil {
			headers = map[string]string{}
		}
		b, err := json.Marshal(headers)
		if err != nil {
			return v, err
		}
		v[2] = text(string(b))
		if d, ok := ParseRetryAfter(answer.Headers["retry-after"], time.Now()); ok && d != 0 {
			v[3] = text(fmt.Sprintf("%d microseconds", d.Microseconds()))
		}
	}
	if answer.Body != nil {
		// text holds neither NUL nor invalid UTF-8 (a receiver's binary answer).
		v[1] = text(strings.ToValidUTF8(strings.ReplaceAll(string(answer.Body), "\x00", "\uFFFD"), "\uFFFD"))
	}
	if answer.Error != "" {
		v[4] = text(answer.Error)
	}
	return v, nil
}

func (s *Sender) record(ctx context.Context, a Attempt, answer Answer) (Result, error) {
	v, err := resultArgs(answer)
	if err != nil {
		return nil, err
	}
	var (
		state    string
		attempts int
		nextAt   time.Time
	)
	err = s.call(ctx, func(db sendDB) error {
		return db.QueryRow(ctx, resultSQL, execMode, a.Scope, a.Operation, a.Token, v[0], v[1], v[2], v[3],
			v[4]).Scan(&state, &attempts, &nextAt)
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "IK002" {
			return Lost{Scope: a.Scope, Operation: a.Operation}, nil
		}
		if errors.As(err, &pgErr) && pgErr.Code == "IK003" {
			// Recorded already: the COMMIT's reply was lost with the connection.
			return s.Status(ctx, a.Scope, a.Operation)
		}
		return nil, classify(err)
	}
	return s.recorded(a, answer, state, attempts, nextAt), nil
}

// recorded is the Result of an answer that idem_send_result recorded (state, attempts, nextAt).
func (s *Sender) recorded(a Attempt, answer Answer, state string, attempts int, nextAt time.Time) Result {
	var result Result
	switch state {
	case "done":
		result = Delivered{Status: answer.Status, Headers: answer.Headers, Body: answer.Body}
	case "gave_up":
		result = Unknown{Key: a.Key, Attempts: attempts, LastStatus: answer.Status, LastError: answer.Error}
	default:
		result = NotYet{State: state, Attempts: attempts, NextAttemptAt: nextAt, LastStatus: answer.Status,
			LastError: answer.Error}
	}
	if _, notYet := result.(NotYet); !notYet && s.o.OnFinished != nil {
		s.o.OnFinished(a, result)
	}
	return result
}

// The answers of a round, recorded in one statement (one round trip, one transaction), in the
// order given: idem_send_result once per element of the arrays.
const resultsSQL = `
SELECT r.state, r.attempts, r.next_attempt_at
FROM unnest($1::text[], $2::text[], $3::text[]::uuid[], $4::text[]::int[], $5::text[], $6::text[]::jsonb[],
            $7::text[]::interval[], $8::text[])
       WITH ORDINALITY AS a(scope, operation, token, http_status, response_body, response_headers, retry_after,
                            error, n),
     LATERAL idempotency.idem_send_result(a.scope, a.operation, a.token, a.http_status, a.response_body,
                                          a.response_headers, a.retry_after, a.error) AS r
ORDER BY a.n`

// recordRound records the answers of a round together (answers[i] is taken[i]'s): one
// statement, so one round trip and one transaction, in (scope, operation) order (so that two
// senders never lock rows in opposite orders). When the extension refuses one of them (IK002:
// its lease was lost; IK003: recorded already) the statement records none, and each is recorded
// on its own. The results are in taken's order.
func (s *Sender) recordRound(ctx context.Context, taken []Attempt, answers []Answer) ([]Result, error) {
	order := make([]int, len(taken))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int {
		if c := strings.Compare(taken[x].Scope, taken[y].Scope); c != 0 {
			return c
		}
		return strings.Compare(taken[x].Operation, taken[y].Operation)
	})
	var columns [8][]*string
	for _, i := range order {
		v, err := resultArgs(answers[i])
		if err != nil {
			return nil, err
		}
		a := taken[i]
		for c, value := range append([]*string{&a.Scope, &a.Operation, &a.Token}, v[:]...) {
			columns[c] = append(columns[c], value)
		}
	}
	type row struct {
		state    string
		attempts int
		nextAt   time.Time
	}
	var rows []row
	err := s.call(ctx, func(db sendDB) error {
		args := []any{execMode}
		for _, c := range columns {
			args = append(args, c)
		}
		got, err := db.Query(ctx, resultsSQL, args...)
		if err != nil {
			return err
		}
		rows, err = pgx.CollectRows(got, func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.state, &x.attempts, &x.nextAt)
		})
		return err
	})
	results := make([]Result, len(taken))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "IK002" || pgErr.Code == "IK003") {
		for _, i := range order {
			if results[i], err = s.record(ctx, taken[i], answers[i]); err != nil {
				return nil, err
			}
		}
		return results, nil
	}
	if err != nil {
		return nil, classify(err)
	}
	if len(rows) != len(order) {
		return nil, fmt.Errorf("idempotency: %d answers recorded, %d results returned", len(order), len(rows))
	}
	for k, i := range order {
		results[i] = s.recorded(taken[i], answers[i], rows[k].state, rows[k].attempts, rows[k].nextAt)
	}
	return results, nil
}

const nextSQL = `
SELECT scope, operation, target, key, request::text, attempt, token::text, locked_until, give_up_at
FROM idempotency.idem_send_next(target => $1::text, max_rows => $2::int, lease => $3::interval,
       scope => $4::text, operation => $5::text)`

// take hands out due sends, and an instant at or before the end of their lease (it began at
// the transaction's now(), after this instant; time.Time's monotonic reading measures it).
func (s *Sender) take(ctx context.Context, target string, maxRows int, scope, operation string) ([]Attempt,
	time.Time, error) {
	leaseEnd := time.Now().Add(s.o.Lease)
	var taken []Attempt
	err := s.call(ctx, func(db sendDB) error {
		rows, err := db.Query(ctx, nextSQL, execMode, nullString(target), maxRows, interval(s.o.Lease),
			nullString(scope), nullString(operation))
		if err != nil {
			return err
		}
		taken, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
			var a Attempt
			var request *string
			err := row.Scan(&a.Scope, &a.Operation, &a.Target, &a.Key, &request, &a.Number, &a.Token,
				&a.LockedUntil, &a.GiveUpAt)
			if request != nil {
				a.Request = json.RawMessage(*request)
			}
			return a, err
		})
		return err
	})
	return taken, leaseEnd, classify(err)
}

// Deliver is the inline path, right after the COMMIT that prepared the send: one attempt if
// it is due and no other sender holds it; otherwise (or after a retryable answer) where it is
// now. The retries are the worker's.
func (s *Sender) Deliver(ctx context.Context, scope, operation string) (Result, error) {
	taken, leaseEnd, err := s.take(ctx, "", 1, scope, operation)
	if err != nil {
		return nil, err
	}
	if len(taken) == 1 {
		return s.attempt(ctx, taken[0], leaseEnd)
	}
	return s.Status(ctx, scope, operation)
}

const rowSQL = `
SELECT state, attempts, next_attempt_at, last_status, last_error, response_status, response_body,
       response_headers::text, key
FROM idempotency.outbound WHERE scope = $1::text AND operation = $2::text`

// Status is where the send is now, from its row; ErrNoRecord when there is none.
func (s *Sender) Status(ctx context.Context, scope, operation string) (Result, error) {
	var (
		state, key               string
		attempts                 int
		nextAt                   time.Time
		lastStatus, status       *int32
		lastError, body, headers *string
	)
	err := s.pool.QueryRow(ctx, rowSQL, execMode, scope, operation).Scan(&state, &attempts, &nextAt, &lastStatus,
		&lastError, &status, &body, &headers, &key)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: no outbound record for operation %q in scope %q", ErrNoRecord, operation, scope)
	}
	if err != nil {
		return nil, classify(err)
	}
	switch state {
	case "done":
		d, err := delivered(status, body, headers)
		if err != nil {
			return nil, err
		}
		return d, nil
	case "gave_up":
		return Unknown{Key: key, Attempts: attempts, LastStatus: int(derefInt(lastStatus)), LastError: deref(lastError)}, nil
	}
	return NotYet{State: state, Attempts: attempts, NextAttemptAt: nextAt, LastStatus: int(derefInt(lastStatus)),
		LastError: deref(lastError)}, nil
}

// RunOnce is one round of the worker: it takes up to Concurrency due sends of target (""
// any target), attempts them at once and, once every attempt has ended, records their answers
// together (one statement, one round trip: recordRound). It returns how many it took, and the
// database's error; the answers that error kept from being recorded are recorded by Run when it
// has reconnected, while their lease holds.
func (s *Sender) RunOnce(ctx context.Context, target string) (int, error) {
	taken, leaseEnd, err := s.take(ctx, target, s.o.Concurrency, "", "")
	if err != nil {
		return 0, err
	}
	ctx = context.WithoutCancel(ctx)
	answers := make([]Answer, len(taken))
	var wg sync.WaitGroup
	for i, a := range taken {
		wg.Go(func() { answers[i] = s.answer(ctx, a, leaseEnd) })
	}
	wg.Wait()
	switch len(taken) {
	case 0:
	case 1:
		_, err = s.record(ctx, taken[0], answers[0])
	default:
		_, err = s.recordRound(ctx, taken, answers)
	}
	if err != nil {
		s.keep(taken, answers, leaseEnd)
	}
	return len(taken), err
}

// Idle reports whether no send of target ("": any target) is pending or sending.
func (s *Sender) Idle(ctx context.Context, target string) (bool, error) {
	var idle bool
	err := s.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM idempotency.outbound
		WHERE state IN ('pending', 'sending') AND ($1::text IS NULL OR target = $1::text))`,
		execMode, nullString(target)).Scan(&idle)
	return idle, classify(err)
}

// Run is the worker: rounds of RunOnce while there is due work; between them it waits for a
// NOTIFY on idempotency_send (a send committed) or PollInterval, whichever first. It returns
// only when ctx is cancelled (after the attempts in flight are recorded) or, with untilIdle,
// once nothing of target is left to send.
//
// A database error (its backend terminated, the server restarting or down, a failover, a
// deadlock, a serialization failure) does not end it: it is logged (LogDBError), the LISTEN
// session is closed, and after a wait of exponential backoff with full jitter (ReconnectBase,
// ReconnectCap) the worker connects again, logs LogDBReconnected, records the answers the
// error kept from being recorded while their lease holds, and goes on.
func (s *Sender) Run(ctx context.Context, target string, untilIdle bool) {
	var listener *pgx.Conn
	closeListener := func() {
		if listener != nil { // a session that broke: its Close does not wait long for it
			closing, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = listener.Close(closing)
			listener = nil
		}
	}
	defer closeListener()
	for failures := 0; ctx.Err() == nil; {
		idle, err := s.step(ctx, &listener, target, untilIdle, failures > 0)
		if err == nil {
			if idle {
				return
			}
			failures = 0
			continue
		}
		if ctx.Err() != nil { // an error of the stop itself
			return
		}
		failures++
		delay := reconnectDelay(failures, s.o.ReconnectBase, s.o.ReconnectCap, rand.Float64())
		s.logger().LogAttrs(ctx, slog.LevelWarn, LogDBError, slog.String("code", dbErrorCode(err)),
			slog.Any("error", err), slog.Duration("retry_in", delay))
		closeListener()
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// step is one turn of Run: the LISTEN session made if there is none (and, after an error, the
// answers it kept recorded), a round, and when the round found nothing the wait for a NOTIFY.
// idle: untilIdle and nothing of target is left.
func (s *Sender) step(ctx context.Context, listener **pgx.Conn, target string, untilIdle,
	reconnecting bool) (idle bool, err error) {
	work := context.WithoutCancel(ctx) // a round in flight finishes after ctx ends
	if *listener == nil {
		conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig)
		if err != nil {
			return false, err
		}
		*listener = conn
		if _, err := conn.Exec(ctx, "LISTEN "+SendChannel); err != nil {
			return false, err
		}
		if reconnecting {
			s.logger().LogAttrs(ctx, slog.LevelInfo, LogDBReconnected)
		}
		if err := s.recordUnrecorded(work); err != nil {
			return false, err
		}
	}
	n, err := s.RunOnce(work, target)
	if err != nil || n > 0 {
		return false, err
	}
	if untilIdle {
		if idle, err := s.Idle(ctx, target); err != nil || idle {
			return idle, err
		}
	}
	wait, cancel := context.WithTimeout(ctx, s.o.PollInterval)
	defer cancel()
	if _, err := (*listener).WaitForNotification(wait); err != nil && wait.Err() == nil {
		return false, err
	}
	return false, nil
}

// recordUnrecorded records the answers a database error kept from being recorded, those whose
// lease holds; the others are left for a sender to take again when their lease ends.
func (s *Sender) recordUnrecorded(ctx context.Context) error {
	s.mu.Lock()
	kept := s.unrecorded
	s.unrecorded = nil
	s.mu.Unlock()
	for i, u := range kept {
		a := u.attempt
		attrs := []slog.Attr{slog.String("scope", a.Scope), slog.String("operation", a.Operation),
			slog.Int("attempt", a.Number)}
		if !time.Now().Before(u.leaseEnd) {
			s.logger().LogAttrs(ctx, slog.LevelInfo, "idempotency sender: an answer was not recorded before its "+
				"lease ended: the send is left to be taken again", attrs...)
			continue
		}
		if _, err := s.record(ctx, a, u.answer); err != nil {
			s.mu.Lock()
			s.unrecorded = append(kept[i:len(kept):len(kept)], s.unrecorded...)
			s.mu.Unlock()
			return err
		}
		s.logger().LogAttrs(ctx, slog.LevelInfo, "idempotency sender: recorded an answer after reconnecting", attrs...)
	}
	return nil
}
