package idempotency

// The sender's pure rules: which of its options it refuses, the extension's settings it sets in
// its own transactions, the worker's wait after a database error, and how that error is named
// in its log.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// MaxRetryBudget is the largest idempotency.send_retry_budget the extension takes.
const MaxRetryBudget = 1_000_000.0

// setting is one of the extension's settings, as set_config takes it.
type setting struct{ name, value string }

// checkTimeout: an attempt is bounded by the timeout, and it must end before the lease does: an
// attempt that outlives its lease runs beside the attempt of the sender that took the send over.
func checkTimeout(timeout, lease time.Duration) error {
	if timeout <= 0 || lease <= 0 {
		return fmt.Errorf("idempotency: Timeout (%v) and Lease (%v) must be positive", timeout, lease)
	}
	if timeout >= lease {
		return fmt.Errorf("idempotency: Timeout (%v) must be below Lease (%v): an attempt that outlives its lease "+
			"runs beside the attempt of the sender that takes the send over", timeout, lease)
	}
	return nil
}

// checkOptional: zero is the database's value; otherwise at least the microsecond an interval
// holds (a value the database refuses would fail every call).
func checkOptional(name string, d time.Duration) error {
	if d != 0 && d < time.Microsecond {
		return fmt.Errorf("idempotency: %s (%v) must be positive, of at least 1µs (0: the database's)", name, d)
	}
	return nil
}

// settingValues are the extension's settings a sender sets in each of its transactions; those
// not given (nil, 0) stay the database's.
func settingValues(retryBudget *float64, backoffBase, backoffCap time.Duration) ([]setting, error) {
	var values []setting
	if retryBudget != nil {
		b := *retryBudget
		if !(b >= 0 && b <= MaxRetryBudget) { // NaN too
			return nil, fmt.Errorf("idempotency: RetryBudget must be a number from 0 to %g (got %g)", MaxRetryBudget, b)
		}
		values = append(values, setting{"idempotency.send_retry_budget", strconv.FormatFloat(b, 'g', -1, 64)})
	}
	for _, s := range []struct {
		option, name string
		value        time.Duration
	}{{"BackoffBase", "idempotency.send_backoff_base", backoffBase}, {"BackoffCap", "idempotency.send_backoff_cap", backoffCap}} {
		if err := checkOptional(s.option, s.value); err != nil {
			return nil, err
		}
		if s.value != 0 {
			values = append(values, setting{s.name, interval(s.value).(string)})
		}
	}
	return values, nil
}

// setConfigSQL sets n settings for the rest of the transaction: set_config(name, value, true).
func setConfigSQL(n int) string {
	calls := make([]string, n)
	for i := range calls {
		calls[i] = fmt.Sprintf("set_config($%d::text, $%d::text, true)", 2*i+1, 2*i+2)
	}
	return "SELECT " + strings.Join(calls, ", ")
}

// reconnectDelay is the wait after the failures-th database error in a row: exponential
// backoff with full jitter, anywhere from 0 to min(cap, base * 2^(failures - 1)). random is in
// [0, 1).
func reconnectDelay(failures int, base, cap time.Duration, random float64) time.Duration {
	ceiling := float64(cap)
	if failures <= 63 {
		ceiling = math.Min(ceiling, float64(base)*math.Exp2(float64(max(failures, 1)-1)))
	}
	return time.Duration(random * ceiling)
}

// dbErrorCode names a database error in the worker's log: its SQLSTATE, or its class when the
// server sent none (ConnectError for a connection refused, ConnectionLost for one that
// broke, Timeout).
func dbErrorCode(err error) string {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Code
	case errors.As(err, &connectErr):
		return "ConnectError"
	case pgconn.Timeout(err) || errors.As(err, &netErr) && netErr.Timeout():
		return "Timeout"
	case errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed):
		return "ConnectionLost"
	}
	for inner := errors.Unwrap(err); inner != nil; inner = errors.Unwrap(inner) {
		err = inner
	}
	return fmt.Sprintf("%T", err)
}

// firstLine is an error's message on one line.
func firstLine(err error) string {
	text, _, _ := strings.Cut(strings.TrimSpace(err.Error()), "\n")
	return text
}
