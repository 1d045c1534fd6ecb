package idempotency

import (
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassifyBySQLState(t *testing.T) {
	for code, kind := range bySQLState {
		err := classify(fmt.Errorf("query: %w", &pgconn.PgError{Code: code}))
		var e *Error
		if !errors.Is(err, kind) || !errors.As(err, &e) || e.SQLState != code {
			t.Errorf("SQLSTATE %s: %v; want %v", code, err, kind)
		}
	}
	for _, code := range []string{"08006", "57P01", "57P03", "53300"} {
		if err := classify(&pgconn.PgError{Code: code}); !errors.Is(err, ErrUnavailable) {
			t.Errorf("SQLSTATE %s: %v; want ErrUnavailable", code, err)
		}
	}
	if err := classify(fmt.Errorf("read: %w", io.ErrUnexpectedEOF)); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a connection cut mid-answer: %v; want ErrUnavailable", err)
	}
	other := &pgconn.PgError{Code: "23505"}
	if err := classify(other); err != other {
		t.Errorf("an unrelated SQLSTATE: %v; want the error unchanged", err)
	}
	if !LostClaim(classify(&pgconn.PgError{Code: "IK001"})) || LostClaim(classify(&pgconn.PgError{Code: "IK003"})) {
		t.Error("LostClaim: want IK001 and IK002 only")
	}
}

func TestPatternRoute(t *testing.T) {
	cases := []struct{ pattern, path, want string }{
		{"POST /charges/{id}", "/charges/ch_1", "/charges/{id}"},
		{"/charges/", "/charges/x", "/charges/"},
		{"POST example.com/charges", "/charges", "/charges"},
		{"", "/raw/path", "/raw/path"},
	}
	for _, c := range cases {
		r := httptest.NewRequest("POST", c.path, nil)
		r.Pattern = c.pattern
		if got := PatternRoute(r); got != c.want {
			t.Errorf("pattern %q: %q, want %q", c.pattern, got, c.want)
		}
	}
}

func TestSmallPieces(t *testing.T) {
	if !Claimed.Owned() || !Reclaimed.Owned() || Replay.Owned() || InProgress.Owned() {
		t.Error("Owned: want claimed and reclaimed only")
	}
	if _, err := parseOutcome("maybe"); err == nil {
		t.Error("an unknown outcome was accepted")
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if a, b := NewToken(), NewToken(); !uuid.MatchString(a) || a == b {
		t.Errorf("NewToken: %s, %s; want two random version 4 UUIDs", a, b)
	}
	if interval(0) != nil || interval(1500*time.Millisecond) != "1500000 microseconds" {
		t.Errorf("interval: %v, %v", interval(0), interval(1500*time.Millisecond))
	}
}
