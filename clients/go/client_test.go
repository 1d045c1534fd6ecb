package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestClientOutcomes(t *testing.T) {
	pool := testPool(t)
	scope, key := uniqueName(t), "k-1"
	c, err := ClaimKey(testCtx, pool, scope, key, ClaimOptions{JSON: []byte(`{"amount": 500}`), Lease: time.Minute})
	if err != nil || c.Outcome != Claimed || c.Token == "" || c.Attempts != 1 || c.LockedUntil == nil {
		t.Fatalf("first claim: %+v, %v", c, err)
	}
	dup, err := ClaimKey(testCtx, pool, scope, key, ClaimOptions{JSON: []byte(`{"amount": 500}`)})
	if err != nil || dup.Outcome != InProgress || dup.Token != "" || dup.RetryAfter < 55 || dup.RetryAfter > 60 {
		t.Errorf("a duplicate of a committed claim: %+v, %v; want in_progress, Retry-After about 60", dup, err)
	}
	stored, err := Complete(testCtx, pool, scope, key, c.Token, 201, []byte(`{"id":"ch_1", "amount":500}`),
		map[string]string{"Location": "/charges/ch_1"})
	if err != nil || string(stored) != `{"id": "ch_1", "amount": 500}` {
		t.Errorf("complete: %q, %v; want the body as jsonb prints it", stored, err)
	}
	r, err := ClaimKey(testCtx, pool, scope, key, ClaimOptions{JSON: []byte(`{ "amount": 500.0 }`)})
	if err != nil || r.Outcome != Replay || r.HTTPStatus != 201 || r.ResponseStatus != 201 ||
		string(r.ResponseBody) != string(stored) || r.ResponseHeaders["Location"] != "/charges/ch_1" {
		t.Errorf("replay (the same JSON written differently): %+v, %v", r, err)
	}
	m, err := ClaimKey(testCtx, pool, scope, key, ClaimOptions{JSON: []byte(`{"amount": 501}`)})
	if err != nil || m.Outcome != Mismatch || m.HTTPStatus != 422 {
		t.Errorf("another body: %+v, %v; want mismatch 422", m, err)
	}
	rec, err := Lookup(testCtx, pool, scope, key)
	if err != nil || rec == nil || rec.Status != "completed" || rec.ResponseStatus != 201 || rec.Attempts != 1 {
		t.Errorf("lookup: %+v, %v", rec, err)
	}
	if rec, err := Lookup(testCtx, pool, scope, "no-such-key"); rec != nil || err != nil {
		t.Errorf("lookup of an unknown key: %+v, %v; want nil, nil", rec, err)
	}
}

func TestClientReleaseAndTakeover(t *testing.T) {
	pool := testPool(t)
	scope := uniqueName(t)
	c, err := ClaimKey(testCtx, pool, scope, "k", ClaimOptions{Lease: time.Minute})
	if err != nil || c.Outcome != Claimed {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	if ok, err := Release(testCtx, pool, scope, "k", c.Token); !ok || err != nil {
		t.Errorf("release: %v, %v; want true", ok, err)
	}
	if ok, err := Release(testCtx, pool, scope, "k", c.Token); ok || err != nil {
		t.Errorf("a second release: %v, %v; want false", ok, err)
	}
	if _, err := Complete(testCtx, pool, scope, "k", c.Token, 200, nil, nil); !errors.Is(err, ErrNoRecord) {
		t.Errorf("complete after release: %v; want ErrNoRecord (IK001)", err)
	}
	// A claim whose lease ends is taken over, with its last checkpoint; the old token is fenced.
	old, err := ClaimKey(testCtx, pool, scope, "k", ClaimOptions{Lease: time.Minute})
	if err != nil || old.Outcome != Claimed {
		t.Fatalf("claim again: %+v, %v", old, err)
	}
	until, err := Checkpoint(testCtx, pool, scope, "k", old.Token, "step-1", []byte(`{"n": 1}`), 50*time.Millisecond)
	if err != nil || time.Until(until) > time.Second {
		t.Fatalf("checkpoint: %v, %v", until, err)
	}
	time.Sleep(150 * time.Millisecond)
	re, err := ClaimKey(testCtx, pool, scope, "k", ClaimOptions{Lease: time.Minute})
	if err != nil || re.Outcome != Reclaimed || re.Attempts != 2 || re.RecoveryPoint != "step-1" ||
		string(re.RecoveryData) != `{"n": 1}` || re.Token == old.Token {
		t.Fatalf("after the lease: %+v, %v; want reclaimed with the checkpoint", re, err)
	}
	_, err = Complete(testCtx, pool, scope, "k", old.Token, 201, nil, nil)
	var e *Error
	if !errors.Is(err, ErrNotOwner) || !LostClaim(err) || !errors.As(err, &e) || e.SQLState != "IK002" {
		t.Errorf("the old owner's late completion: %v; want ErrNotOwner (IK002)", err)
	}
	if _, err := Checkpoint(testCtx, pool, scope, "k", old.Token, "x", nil, 0); !errors.Is(err, ErrNotOwner) {
		t.Errorf("the old owner's checkpoint: %v; want ErrNotOwner", err)
	}
	if _, err := Complete(testCtx, pool, scope, "k", re.Token, 201, nil, nil); err != nil {
		t.Errorf("the new owner's completion: %v", err)
	}
	if _, err := Complete(testCtx, pool, scope, "k", re.Token, 201, nil, nil); !errors.Is(err, ErrAlreadyCompleted) {
		t.Errorf("completing twice: %v; want ErrAlreadyCompleted (IK003)", err)
	}
}

func TestClientTokenRepeated(t *testing.T) {
	pool := testPool(t)
	scope, token := uniqueName(t), NewToken()
	first, err := ClaimKey(testCtx, pool, scope, "k", ClaimOptions{Token: token})
	if err != nil || first.Outcome != Claimed || first.Token != token {
		t.Fatalf("claim with a token: %+v, %v", first, err)
	}
	again, err := ClaimKey(testCtx, pool, scope, "k", ClaimOptions{Token: token})
	if err != nil || again.Outcome != Claimed || again.Token != token || again.Attempts != 1 {
		t.Errorf("the claim repeated with its token: %+v, %v; want claimed again, same token", again, err)
	}
	other, err := ClaimKey(testCtx, pool, scope, "k", ClaimOptions{Token: NewToken()})
	if err != nil || other.Outcome != InProgress {
		t.Errorf("another token: %+v, %v; want in_progress", other, err)
	}
}

func TestClientExpiredTombstone(t *testing.T) {
	pool := testPool(t)
	scope := uniqueName(t)
	// Claimed and completed in one transaction (one now()), expired a moment later.
	err := pgx.BeginFunc(testCtx, pool, func(tx pgx.Tx) error {
		c, err := ClaimKey(testCtx, tx, scope, "k", ClaimOptions{TTL: time.Millisecond})
		if err != nil || c.Outcome != Claimed {
			t.Fatalf("claim: %+v, %v", c, err)
		}
		_, err = Complete(testCtx, tx, scope, "k", c.Token, 201, []byte(`{}`), nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	err = pgx.BeginFunc(testCtx, pool, func(tx pgx.Tx) error {
		mustExec(t, tx, "SET LOCAL idempotency.tombstone_ttl = '1 hour'")
		e, err := ClaimKey(testCtx, tx, scope, "k", ClaimOptions{})
		if err != nil || e.Outcome != Expired || e.HTTPStatus != 410 || e.ResponseStatus != 201 {
			t.Errorf("an expired key with tombstones on: %+v, %v; want expired 410", e, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestClientErrorsBySQLState(t *testing.T) {
	pool := testPool(t)
	scope := uniqueName(t)
	cases := []struct {
		name  string
		err   error
		kind  error
		state string
	}{
		{"an empty key", claimErr(pool, scope, "", ClaimOptions{}), ErrInvalidArgument, "22023"},
		{"a key of 256 characters", claimErr(pool, scope, strings.Repeat("k", 256), ClaimOptions{}), ErrInvalidArgument, "22023"},
		{"a negative lease", claimErr(pool, scope, "k", ClaimOptions{Lease: -time.Second}), ErrInvalidArgument, "22023"},
		{"a status outside 100-599", completeErr(pool, scope, 700), ErrInvalidArgument, "22023"},
		{"complete without a claim", completeErr(pool, scope, 200), ErrNoRecord, "IK001"},
	}
	for _, c := range cases {
		var e *Error
		if !errors.Is(c.err, c.kind) || !errors.As(c.err, &e) || e.SQLState != c.state {
			t.Errorf("%s: %v; want %v (%s)", c.name, c.err, c.kind, c.state)
		}
	}
	// 55P03: a duplicate waiting behind an open transaction's claim, with a short lock_timeout.
	tx, err := pool.Begin(testCtx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(testCtx) }()
	if c, err := ClaimKey(testCtx, tx, scope, "held", ClaimOptions{}); err != nil || c.Outcome != Claimed {
		t.Fatalf("claim in a transaction: %+v, %v", c, err)
	}
	err = pgx.BeginFunc(testCtx, pool, func(tx2 pgx.Tx) error {
		mustExec(t, tx2, "SET LOCAL lock_timeout = '100ms'")
		_, err := ClaimKey(testCtx, tx2, scope, "held", ClaimOptions{})
		return err
	})
	if !errors.Is(err, ErrLockTimeout) {
		t.Errorf("a duplicate behind an open claim: %v; want ErrLockTimeout (55P03)", err)
	}
}

func claimErr(pool *pgxpool.Pool, scope, key string, o ClaimOptions) error {
	_, err := ClaimKey(testCtx, pool, scope, key, o)
	return err
}

func completeErr(pool *pgxpool.Pool, scope string, status int) error {
	_, err := Complete(testCtx, pool, scope, "never-claimed", NewToken(), status, nil, nil)
	return err
}

// The fingerprint the claim computes in SQL is idem_fingerprint's: canonical JSON (RFC 8785)
// for JSON, SHA-256 of the bytes otherwise.
func TestClientFingerprint(t *testing.T) {
	pool := testPool(t)
	a, err1 := FingerprintJSON(testCtx, pool, []byte(`{"b":1,"a":2}`), nil)
	b, err2 := FingerprintJSON(testCtx, pool, []byte(`{ "a": 2, "b": 1.0 }`), nil)
	c, err3 := FingerprintJSON(testCtx, pool, []byte(`{"a":2,"b":1,"nonce":"x"}`), []string{"nonce"})
	if err1 != nil || err2 != nil || err3 != nil || a != b || a != c || len(a) != len("sha256:")+64 {
		t.Errorf("fingerprints %q %q %q (%v %v %v): want one value", a, b, c, err1, err2, err3)
	}
	scope := uniqueName(t)
	if _, err := ClaimKey(testCtx, pool, scope, "json", ClaimOptions{JSON: []byte(`{"b":1,"a":2}`)}); err != nil {
		t.Fatal(err)
	}
	if rec, err := Lookup(testCtx, pool, scope, "json"); err != nil || rec.Fingerprint != a {
		t.Errorf("the claim's JSON fingerprint: %+v, %v; want %s", rec, err, a)
	}
	raw := []byte("not json \x00\xff")
	if _, err := ClaimKey(testCtx, pool, scope, "bytes", ClaimOptions{Bytes: raw}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if rec, err := Lookup(testCtx, pool, scope, "bytes"); err != nil || rec.Fingerprint != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("the claim's bytes fingerprint: %+v, %v; want the SHA-256 of the bytes", rec, err)
	}
	if _, err := ClaimKey(testCtx, pool, scope, "given", ClaimOptions{Fingerprint: "mine"}); err != nil {
		t.Fatal(err)
	}
	if rec, err := Lookup(testCtx, pool, scope, "given"); err != nil || rec.Fingerprint != "mine" {
		t.Errorf("a given fingerprint: %+v, %v", rec, err)
	}
}

func TestClientSeen(t *testing.T) {
	pool := testPool(t)
	scope := uniqueName(t)
	first, err1 := Seen(testCtx, pool, scope, "msg-1", 0)
	again, err2 := Seen(testCtx, pool, scope, "msg-1", time.Hour)
	if !first || again || err1 != nil || err2 != nil {
		t.Errorf("seen: %v %v (%v %v); want true then false", first, again, err1, err2)
	}
	many, err := SeenMany(testCtx, pool, scope, []string{"msg-1", "msg-2", "msg-2"}, 0)
	if err != nil || len(many) != 3 || many[0] || !many[1] || many[2] {
		t.Errorf("seen_many: %v, %v; want [false true false]", many, err)
	}
}

func TestClientUnavailable(t *testing.T) {
	pool, err := pgxpool.New(testCtx, "postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = ClaimKey(testCtx, pool, "s", "k", ClaimOptions{})
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("a claim on a refused connection: %v; want ErrUnavailable", err)
	}
}
