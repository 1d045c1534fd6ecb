package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Mode is how a route claims its key.
type Mode int

const (
	// SameTransaction: BEGIN, the claim, the handler's writes on Handle.Tx(), idem_complete
	// with the response, COMMIT: all or nothing. A duplicate waits on the claim, then replays.
	SameTransaction Mode = iota
	// CommittedFirst: the claim commits at once with a lease, renewed while the handler runs;
	// a duplicate gets 409 at once. For work outside the database.
	CommittedFirst
)

// Options are a Middleware's settings, shared by its routes.
type Options struct {
	// Tenant names the caller (an API key, an account); an error answers at once, before any
	// claim: a *Problem as it is (a 401, say), anything else 500. Nil: no tenant.
	Tenant func(r *http.Request) (string, error)
	// Route is the route template (default: the standard mux's r.Pattern without its method,
	// else the path). With chi: chi.RouteContext(r.Context()).RoutePattern().
	Route func(r *http.Request) string
	// Scope composes the scope (default "TENANT:METHOD ROUTE", or "METHOD ROUTE" without Tenant).
	Scope func(tenant string, r *http.Request, route string) string
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// MaxBodyBytes (default 1 MiB): a larger request body is answered 413 before any claim.
	MaxBodyBytes int64
	// PoolTimeout (default 1 s): the longest wait for a connection for a claim (for both of
	// its tries, when the first connection was found dead), whatever the pool's own settings;
	// then 503. It bounds how long a request waits while the database is down.
	PoolTimeout time.Duration
}

// Policy is one route's protection.
type Policy struct {
	Mode Mode
	// Lease: CommittedFirst's lease (default 30 s), renewed every third of it; SameTransaction
	// passes it to the claim when set.
	Lease time.Duration
	TTL   time.Duration // 0: the extension's idempotency.default_ttl
	// Wait: a duplicate of a committed-first claim waits this long for the owner before 409.
	Wait time.Duration
	// LockTimeout: SameTransaction's SET LOCAL lock_timeout (default 5 s): how long a
	// duplicate waits behind the first before 409.
	LockTimeout  time.Duration
	IgnoreFields []string // top-level JSON fields left out of the fingerprint
	Optional     bool     // a request without Idempotency-Key runs unprotected (default: 400)
	// ReplayHeaders are the response headers stored and replayed (default Location, Content-Type).
	ReplayHeaders []string
	// StoreServerErrors stores 5xx answers (replayed later); by default they give the key back.
	StoreServerErrors bool
}

// RefusedStatuses are the handler answers that mean "refused before any work": never stored,
// the key is given back, so the client can fix the request and retry with the same key
// (contract/contract.json's refused_statuses; a validation error's 422 is one).
var RefusedStatuses = map[int]bool{400: true, 401: true, 403: true, 404: true, 405: true, 406: true,
	408: true, 411: true, 413: true, 414: true, 415: true, 422: true, 429: true}

// disposition is what becomes of the claim after the handler.
type disposition int

const (
	// auto: store the answer, unless its status is in RefusedStatuses or a 5xx (see Policy).
	auto disposition = iota
	// store the answer whatever its status (Handle.StoreAnswer).
	store
	// release the key: the operation was not carried out; the next request runs as new.
	release
	// keep the claim as it is: the side effect's outcome is unknown; a retry takes the claim
	// over once the lease ends (committed first; same transaction rolls back, as release).
	keep
)

// Middleware protects routes with idempotency keys on a pgx pool.
type Middleware struct {
	pool *pgxpool.Pool
	opts Options
	// deferred: whether the extension's idem_claim takes deferred (featureUnknown until the
	// first same-transaction claim reads it from pg_proc).
	deferred atomic.Int32
}

const (
	featureUnknown int32 = iota
	featureAbsent
	featurePresent
)

// New makes a Middleware. Configure the pool with ParseConfig when it goes through PgBouncer.
func New(pool *pgxpool.Pool, opts Options) *Middleware {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	if opts.PoolTimeout == 0 {
		opts.PoolTimeout = time.Second
	}
	if opts.Route == nil {
		opts.Route = PatternRoute
	}
	return &Middleware{pool: pool, opts: opts}
}

// PatternRoute is the standard mux's pattern without its method ("POST /charges/{id}" ->
// "/charges/{id}"), else the request's path.
func PatternRoute(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return r.URL.Path
	}
	if i := strings.IndexByte(p, ' '); i >= 0 {
		p = strings.TrimLeft(p[i+1:], " \t")
	}
	if i := strings.IndexByte(p, '/'); i > 0 { // a host in the pattern
		p = p[i:]
	}
	return p
}

// Protect is the middleware for routes with this policy: std mux
// mux.Handle("POST /charges", m.Protect(p)(handler)); chi r.With(m.Protect(p)).Post(...).
func (m *Middleware) Protect(p Policy) func(http.Handler) http.Handler {
	if p.ReplayHeaders == nil {
		p.ReplayHeaders = []string{"Location", "Content-Type"}
	}
	if p.Mode == CommittedFirst && p.Lease == 0 {
		p.Lease = 30 * time.Second
	}
	if p.LockTimeout == 0 {
		p.LockTimeout = 5 * time.Second
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(p, next, w, r) })
	}
}

// Handle is the claim, for the handler: FromRequest(r).
type Handle struct {
	Scope, Key, Token string
	Outcome           Outcome // Claimed, or Reclaimed after a takeover
	Attempts          int
	// RecoveryPoint and RecoveryData: the last checkpoint of an earlier attempt (Reclaimed).
	// "started" is the renewal's own point: that attempt recorded nothing.
	RecoveryPoint string
	RecoveryData  json.RawMessage

	tx    pgx.Tx
	pool  *pgxpool.Pool
	lease time.Duration

	mu          sync.Mutex
	point       string
	data        []byte
	sideEffect  bool
	disposition disposition
}

type handleKey struct{}

// FromRequest is the claim of a protected request; nil for a request that is not (an optional
// key that was not sent).
func FromRequest(r *http.Request) *Handle {
	h, _ := r.Context().Value(handleKey{}).(*Handle)
	return h
}

// Tx is the claim's open transaction (SameTransaction): write with it; do not commit or roll
// it back, the middleware does. Nil in CommittedFirst mode.
func (h *Handle) Tx() pgx.Tx { return h.tx }

// Checkpoint records progress (CommittedFirst): data is marshalled to JSON. Run it on db, the
// transaction of the side effect it records, so that it fences that write (IK002 if the
// claim was taken over) and commits with it; nil db: the pool. A checkpoint marks a side
// effect: a 5xx answer after it is stored, not released.
func (h *Handle) Checkpoint(ctx context.Context, db Querier, point string, data any) error {
	if h.tx != nil {
		return errors.New("idempotency: Checkpoint is for committed-first routes")
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if db == nil {
		db = h.pool
	}
	if _, err := Checkpoint(ctx, db, h.Scope, h.Key, h.Token, point, raw, h.lease); err != nil {
		return err
	}
	h.mu.Lock()
	h.point, h.data, h.sideEffect = point, raw, true
	h.mu.Unlock()
	return nil
}

// Release gives the key back after the handler, whatever it answers: the operation was not
// carried out, the next request with the key runs as new.
func (h *Handle) Release() { h.setDisposition(release) }

// Keep leaves the claim as it is after the handler, whatever it answers, for "the side
// effect's outcome is unknown": a retry takes the claim over once the lease ends (committed
// first; same transaction rolls back).
func (h *Handle) Keep() { h.setDisposition(keep) }

// StoreAnswer stores the handler's answer whatever its status.
func (h *Handle) StoreAnswer() { h.setDisposition(store) }

func (h *Handle) setDisposition(d disposition) {
	h.mu.Lock()
	h.disposition = d
	h.mu.Unlock()
}

// decide is what becomes of the claim, given the handler's status.
func (h *Handle) decide(p Policy, status int) disposition {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.disposition != auto:
		return h.disposition
	case status >= 500 && !p.StoreServerErrors && !h.sideEffect:
		return release
	case RefusedStatuses[status]:
		return release
	}
	return store
}

// answer is a response held back until the claim is settled.
type answer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *answer) Header() http.Header { return a.header }
func (a *answer) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return a.body.Write(b)
}
func (a *answer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func send(w http.ResponseWriter, status int, header http.Header, body []byte) {
	for name, values := range header {
		w.Header()[name] = values
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// request is one protected request, once its key and scope are known.
type request struct {
	scope, key string
	claimOpts  ClaimOptions
}

func (m *Middleware) serve(p Policy, next http.Handler, w http.ResponseWriter, r *http.Request) {
	tenant := ""
	if m.opts.Tenant != nil {
		t, err := m.opts.Tenant(r)
		if err != nil {
			m.fail(w, "tenant", err)
			return
		}
		tenant = t
	}
	key, err := ParseKey(r.Header.Values("Idempotency-Key"))
	if err != nil {
		var ke *KeyError
		if errors.As(err, &ke) && ke.Missing && p.Optional {
			next.ServeHTTP(w, r)
			return
		}
		slug := slugKeyInvalid
		if ke != nil && ke.Missing {
			slug = slugKeyMissing
		}
		problemOf(slug, 0).WriteTo(w)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.opts.MaxBodyBytes+1))
	if err != nil {
		(&Problem{Status: 400, Title: "Bad request", Detail: "The request body could not be read."}).WriteTo(w)
		return
	}
	if int64(len(body)) > m.opts.MaxBodyBytes {
		(&Problem{Status: 413, Title: "Request body too large",
			Detail: fmt.Sprintf("The request body is larger than %d bytes.", m.opts.MaxBodyBytes)}).WriteTo(w)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	route := m.opts.Route(r)
	var scope string
	switch {
	case m.opts.Scope != nil:
		scope = m.opts.Scope(tenant, r, route)
	case m.opts.Tenant != nil:
		scope = tenant + ":" + r.Method + " " + route
	default:
		scope = r.Method + " " + route
	}
	req := request{scope: scope, key: key, claimOpts: ClaimOptions{TTL: p.TTL, Lease: p.Lease, Ignore: p.IgnoreFields}}
	if jsonbTakes(body) {
		req.claimOpts.JSON = body
	} else {
		req.claimOpts.Bytes = body
	}
	// A client that hangs up does not cut the claim's work in half.
	ctx := context.WithoutCancel(r.Context())
	if p.Mode == CommittedFirst {
		m.committedFirst(ctx, p, req, next, w, r)
	} else {
		m.sameTransaction(ctx, p, req, next, w, r)
	}
}

// fail answers an error met before the handler ran: nothing was done.
func (m *Middleware) fail(w http.ResponseWriter, what string, err error) {
	var problem *Problem
	switch {
	case errors.As(err, &problem):
		problem.WriteTo(w)
	case errors.Is(err, ErrLockTimeout), errors.Is(err, ErrRetry):
		problemOf(slugInProgress, 1).WriteTo(w)
	case errors.Is(err, ErrUnavailable):
		m.opts.Logger.Warn("idempotency: database unavailable", "at", what, "err", err)
		problemOf(slugUnavailable, 1).WriteTo(w)
	default:
		m.opts.Logger.Error("idempotency: request failed", "at", what, "err", err)
		problemOf(slugInternal, 0).WriteTo(w)
	}
}

// failAfterWork answers an error met after the handler ran: no 503 ("nothing was done" may
// be untrue), a 500.
func (m *Middleware) failAfterWork(w http.ResponseWriter, what string, err error) {
	m.opts.Logger.Error("idempotency: storing the answer failed", "at", what, "err", err)
	problemOf(slugInternal, 0).WriteTo(w)
}

// answerWithoutWork answers replay, in_progress, mismatch and expired.
func (m *Middleware) answerWithoutWork(w http.ResponseWriter, c *Claim) {
	if c.Outcome != Replay {
		problemOf(outcomeProblems[c.Outcome], c.RetryAfter).WriteTo(w)
		return
	}
	header, body, err := fromStore(c.ResponseHeaders, c.ResponseBody)
	if err != nil {
		m.fail(w, "replay", err)
		return
	}
	header.Set("Idempotent-Replayed", "true")
	send(w, c.ResponseStatus, header, body)
}

// runHandler runs the handler into a held-back answer; a panic becomes a 500 problem.
func (m *Middleware) runHandler(next http.Handler, r *http.Request) (a *answer) {
	a = &answer{header: http.Header{}}
	defer func() {
		if v := recover(); v != nil {
			m.opts.Logger.Error("idempotency: handler panicked", "panic", v)
			p := problemOf(slugInternal, 0)
			a = &answer{header: http.Header{"Content-Type": {"application/problem+json"}}, status: p.Status}
			a.body.Write(p.Body())
		}
	}()
	next.ServeHTTP(a, r)
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return a
}

func newHandle(req request, c *Claim) *Handle {
	return &Handle{Scope: req.scope, Key: req.key, Token: c.Token, Outcome: c.Outcome, Attempts: c.Attempts,
		RecoveryPoint: c.RecoveryPoint, RecoveryData: c.RecoveryData}
}

func (m *Middleware) sameTransaction(ctx context.Context, p Policy, req request, next http.Handler,
	w http.ResponseWriter, r *http.Request) {
	conn, tx, c, err := m.claimInTransaction(ctx, p, req)
	if err != nil || !c.Outcome.Owned() {
		// The claim wrote nothing: the answer goes out now, the ROLLBACK after it. Releasing a
		// connection still in a transaction closes it (the server rolls back); every path
		// ends the transaction first.
		if conn != nil {
			go func() {
				if tx != nil {
					_ = tx.Rollback(ctx)
				}
				conn.Release()
			}()
		}
		if err != nil {
			m.fail(w, "claim", err)
		} else {
			m.answerWithoutWork(w, c)
		}
		return
	}
	h := newHandle(req, c)
	h.tx = tx
	a := m.runHandler(next, r.WithContext(context.WithValue(ctx, handleKey{}, h)))
	// The server ended the session while the handler ran (a restart, a shutdown): its
	// transaction is gone, nothing was committed.
	lost := conn.Conn().IsClosed()
	decision := h.decide(p, a.status)
	if decision != store || lost {
		_ = tx.Rollback(ctx)
		conn.Release()
		if lost && (decision == store || a.status >= 500) {
			m.opts.Logger.Warn("idempotency: the database went away while the handler ran; nothing was committed",
				"scope", req.scope, "key", req.key, "status", a.status)
			problemOf(slugUnavailable, 1).WriteTo(w)
			return
		}
		send(w, a.status, a.header, a.body.Bytes())
		return
	}
	body, stored := toStore(a.header, a.body.Bytes(), p.ReplayHeaders)
	storedBody, err := completeAndCommit(ctx, conn, tx, req, c.Token, a.status, body, stored)
	if errors.Is(err, errNotCommitted) {
		m.opts.Logger.Warn("idempotency: the database went away before the COMMIT; nothing was committed",
			"scope", req.scope, "key", req.key, "err", err)
		problemOf(slugUnavailable, 1).WriteTo(w)
		return
	}
	if err != nil {
		m.failAfterWork(w, "complete", err)
		return
	}
	m.sendStored(w, a, stored, storedBody)
}

// claimInTransaction is a connection with BEGIN, the lock_timeout and the claim sent on it in
// one round trip (one batch, one Sync), its transaction left open. The connection comes within
// Options.PoolTimeout. A claim whose connection turns out dead (the server restarted or went
// away) is sent once more, on a connection checked live first: its transaction did not commit.
// On an error the connection and transaction are returned too (nil when none was had), for the
// caller to end after answering.
func (m *Middleware) claimInTransaction(ctx context.Context, p Policy, req request) (*pgxpool.Conn, pgx.Tx,
	*Claim, error) {
	deadline := time.Now().Add(m.opts.PoolTimeout)
	for retry := false; ; retry = true {
		conn, err := m.acquire(ctx, deadline, retry)
		if err != nil {
			return nil, nil, nil, err
		}
		tx, c, err := m.sendClaim(ctx, conn, p, req)
		if err == nil || retry || !errors.Is(err, ErrUnavailable) {
			return conn, tx, c, err
		}
		m.opts.Logger.Warn("idempotency: the claim's connection was lost; sending it again on another",
			"scope", req.scope, "key", req.key, "err", err)
		if tx != nil {
			_ = tx.Rollback(ctx)
		}
		conn.Release() // closed: the pool drops it
	}
}

// sendClaim sends BEGIN, SET LOCAL lock_timeout and the claim (deferred when the extension
// has it) on conn in one round trip. The first claim of a Middleware reads pg_proc first.
func (m *Middleware) sendClaim(ctx context.Context, conn *pgxpool.Conn, p Policy, req request) (pgx.Tx, *Claim,
	error) {
	if m.deferred.Load() == featureUnknown {
		has, err := ClaimTakesDeferred(ctx, conn)
		if err != nil {
			return nil, nil, err
		}
		if has {
			m.deferred.Store(featurePresent)
		} else {
			m.deferred.Store(featureAbsent)
		}
	}
	opts := req.claimOpts
	opts.Deferred = m.deferred.Load() == featurePresent
	var c *Claim
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", p.LockTimeout.Milliseconds()))
	b.Queue(claimSQL(opts.Deferred), claimArgs(req.scope, req.key, opts)...).QueryRow(func(row pgx.Row) (err error) {
		c, err = scanClaim(row)
		return err
	})
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		return tx, nil, classify(err)
	}
	return tx, c, nil
}

// acquire takes a connection from the pool, waiting until deadline at most: the package's own
// bound (Options.PoolTimeout), whatever the pool's settings. checked: ping it first and drop
// it when dead, for a second try after a connection was found dead (the pool's other
// connections from before a restart may be dead too).
func (m *Middleware) acquire(ctx context.Context, deadline time.Time, checked bool) (*pgxpool.Conn, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		conn, err := m.pool.Acquire(ctx)
		if err != nil {
			return nil, classify(err)
		}
		if !checked {
			return conn, nil
		}
		err = conn.Ping(ctx)
		if err == nil {
			return conn, nil
		}
		_ = conn.Hijack().Close(ctx) // out of the pool, whatever state the failed ping left it in
		if ctx.Err() != nil {
			return nil, classify(err)
		}
	}
}

// errNotCommitted: the transaction certainly did not commit (the server ended the session
// before the COMMIT, or nothing was sent).
var errNotCommitted = errors.New("idempotency: the transaction did not commit")

// endedSession: the server ended the session (57P01: a fast or smart shutdown,
// pg_terminate_backend). The server does that only where the transaction can still roll
// back, never inside a COMMIT, whose answer goes out first.
func endedSession(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57P01"
}

// completeAndCommit sends idem_complete and COMMIT in one round trip (one batch, one Sync)
// and gives the connection back. A failed idem_complete makes the server skip the COMMIT: the
// transaction is rolled back and the complete's error returned, as with two trips. The server
// ending the session (57P01) before the COMMIT's answer, or a batch that could not be sent at
// all, is errNotCommitted. Any other error of the COMMIT (or a connection lost after the
// complete was sent, before the COMMIT's answer) leaves the outcome unknown and is returned as
// such, never as a success.
func completeAndCommit(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, req request, token string, status int,
	body []byte, headers map[string]string) ([]byte, error) {
	defer conn.Release()
	args, err := completeArgs(req.scope, req.key, token, status, body, headers)
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	var (
		storedBody  []byte
		completeErr error
		committed   bool
	)
	b := &pgx.Batch{}
	b.Queue(completeSQL, args...).QueryRow(func(row pgx.Row) error {
		storedBody, completeErr = scanStored(row)
		return completeErr
	})
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		committed = true
		return nil
	})
	err = conn.SendBatch(ctx, b).Close()
	switch {
	case committed: // the COMMIT's own answer came; whatever failed after it
		return storedBody, nil
	case endedSession(err) || pgconn.SafeToRetry(err):
		return nil, fmt.Errorf("%w: %w", errNotCommitted, err)
	case completeErr != nil && !unreachable(completeErr):
		_ = tx.Rollback(ctx)
		return nil, classify(completeErr)
	}
	return nil, fmt.Errorf("idempotency: COMMIT after idem_complete, outcome unknown: %w", classify(err))
}

// sendStored sends the handler's answer with the body as it was stored, so the first answer
// and every replay are the same bytes.
func (m *Middleware) sendStored(w http.ResponseWriter, a *answer, stored map[string]string, storedBody []byte) {
	_, body, err := fromStore(stored, storedBody)
	if err != nil {
		m.failAfterWork(w, "stored body", err)
		return
	}
	send(w, a.status, a.header, body)
}

func (m *Middleware) committedFirst(ctx context.Context, p Policy, req request, next http.Handler,
	w http.ResponseWriter, r *http.Request) {
	req.claimOpts.Token = NewToken()
	req.claimOpts.Wait = p.Wait
	deadline := time.Now().Add(m.opts.PoolTimeout)
	claim := func(checked bool) (*Claim, error) {
		conn, err := m.acquire(ctx, deadline, checked)
		if err != nil {
			return nil, err
		}
		defer conn.Release()
		claimCtx, cancel := context.WithTimeout(ctx, m.opts.PoolTimeout+p.Wait)
		defer cancel()
		return ClaimKey(claimCtx, conn, req.scope, req.key, req.claimOpts)
	}
	c, err := claim(false)
	if errors.Is(err, ErrUnavailable) {
		// The connection may have broken after the claim committed: the same token tells.
		m.opts.Logger.Warn("idempotency: the claim's connection was lost; repeating it with its token on another",
			"scope", req.scope, "key", req.key, "err", err)
		c, err = claim(true)
	}
	if err != nil {
		m.fail(w, "claim", err)
		return
	}
	if !c.Outcome.Owned() {
		m.answerWithoutWork(w, c)
		return
	}
	h := newHandle(req, c)
	h.pool, h.lease = m.pool, p.Lease
	h.point, h.data = c.RecoveryPoint, c.RecoveryData
	if h.point == "" {
		h.point = "started"
	}
	handlerCtx, cancel := context.WithCancelCause(context.WithValue(ctx, handleKey{}, h))
	defer cancel(nil)
	stop, done := make(chan struct{}), make(chan struct{})
	go m.renew(ctx, h, stop, done, cancel)
	a := m.runHandler(next, r.WithContext(handlerCtx))
	close(stop)
	<-done

	switch h.decide(p, a.status) {
	case keep:
		send(w, a.status, a.header, a.body.Bytes())
		return
	case release:
		if _, err := Release(ctx, m.pool, req.scope, req.key, h.Token); err != nil {
			m.opts.Logger.Warn("idempotency: release failed; the key frees when the lease ends", "err", err)
			if a.status >= 500 && errors.Is(err, ErrUnavailable) {
				// A server error and no side effect recorded, with the database gone: the
				// handler most likely failed for that; the contract's answer is the 503.
				problemOf(slugUnavailable, 1).WriteTo(w)
				return
			}
		}
		send(w, a.status, a.header, a.body.Bytes())
		return
	}
	body, stored := toStore(a.header, a.body.Bytes(), p.ReplayHeaders)
	storedBody, err := Complete(ctx, m.pool, req.scope, req.key, h.Token, a.status, body, stored)
	if LostClaim(err) {
		m.opts.Logger.Warn("idempotency: late completion fenced: the claim was taken over; answering 409",
			"scope", req.scope, "key", req.key, "err", err)
		problemOf(slugSuperseded, 1).WriteTo(w)
		return
	}
	if err != nil {
		m.failAfterWork(w, "complete", err)
		return
	}
	m.sendStored(w, a, stored, storedBody)
}

// renew renews the lease every third of it while the handler runs (idem_checkpoint with the
// last recovery point); a lost claim cancels the handler's context with ErrNotOwner.
func (m *Middleware) renew(ctx context.Context, h *Handle, stop <-chan struct{}, done chan<- struct{},
	cancel context.CancelCauseFunc) {
	defer close(done)
	ticker := time.NewTicker(h.lease / 3)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		h.mu.Lock()
		point, data := h.point, h.data
		h.mu.Unlock()
		_, err := Checkpoint(ctx, h.pool, h.Scope, h.Key, h.Token, point, data, h.lease)
		if LostClaim(err) {
			m.opts.Logger.Warn("idempotency: the claim was taken over while the handler ran", "scope", h.Scope,
				"key", h.Key)
			cancel(err)
			return
		}
		if err != nil {
			m.opts.Logger.Warn("idempotency: lease renewal failed; trying again", "err", err)
		}
	}
}
