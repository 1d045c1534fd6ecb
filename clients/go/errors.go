package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The kinds of error the client returns, by SQLSTATE (docs/reference.md, error codes). Test
// them with errors.Is(err, idempotency.ErrNotOwner); errors.As(err, &e) with e *Error gives the
// SQLSTATE and the server's message.
var (
	ErrNullArgument     = errors.New("idempotency: an argument is NULL where a value is required (22004)")
	ErrInvalidArgument  = errors.New("idempotency: a bad argument value (22023)")
	ErrTooLarge         = errors.New("idempotency: response or checkpoint too large (54000)")
	ErrNoRecord         = errors.New("idempotency: no live record for the key (IK001)")
	ErrNotOwner         = errors.New("idempotency: the token no longer owns the record: do not report success (IK002)")
	ErrAlreadyCompleted = errors.New("idempotency: the record is already completed (IK003)")
	ErrOperationReused  = errors.New("idempotency: the operation was sent with another request, target or key: a new request needs a new operation id (IK004)")
	ErrReadOnly         = errors.New("idempotency: a write on a hot standby (25006)")
	ErrRetry            = errors.New("idempotency: serialization failure or deadlock: retry the transaction (40001, 40P01)")
	ErrLockTimeout      = errors.New("idempotency: lock_timeout behind another transaction's claim of the key (55P03)")
	ErrPrivilege        = errors.New("idempotency: permission denied (42501)")
	// ErrUnavailable: the database could not be reached (refused, reset, shut down, no pool
	// connection in time). Nothing can be assumed done; the middleware answers 503.
	ErrUnavailable = errors.New("idempotency: the database is unavailable")
)

var bySQLState = map[string]error{
	"22004": ErrNullArgument,
	"22023": ErrInvalidArgument,
	"54000": ErrTooLarge,
	"IK001": ErrNoRecord,
	"IK002": ErrNotOwner,
	"IK003": ErrAlreadyCompleted,
	"IK004": ErrOperationReused,
	"25006": ErrReadOnly,
	"40001": ErrRetry,
	"40P01": ErrRetry,
	"55P03": ErrLockTimeout,
	"42501": ErrPrivilege,
}

// Error is a database error of a known kind.
type Error struct {
	Kind     error  // one of the Err* values above
	SQLState string // "" for ErrUnavailable without a server answer
	Err      error  // the driver's error
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %v", e.Kind, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNotOwner) and the like work.
func (e *Error) Is(target error) bool { return target == e.Kind }

// LostClaim reports whether err means the caller no longer owns its claim (IK001, IK002):
// it must not report success.
func LostClaim(err error) bool {
	return errors.Is(err, ErrNotOwner) || errors.Is(err, ErrNoRecord)
}

// classify wraps a driver error in *Error when its kind is known, else returns it unchanged.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var known *Error
	if errors.As(err, &known) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if kind, ok := bySQLState[pgErr.Code]; ok {
			return &Error{Kind: kind, SQLState: pgErr.Code, Err: err}
		}
		if unavailableSQLState(pgErr.Code) {
			return &Error{Kind: ErrUnavailable, SQLState: pgErr.Code, Err: err}
		}
		return err
	}
	if unreachable(err) {
		return &Error{Kind: ErrUnavailable, Err: err}
	}
	return err
}

// unavailableSQLState: connection exceptions, the server shutting down or starting, too many
// connections.
func unavailableSQLState(code string) bool {
	switch code {
	case "57P01", "57P02", "57P03", "53300":
		return true
	}
	return strings.HasPrefix(code, "08")
}

// unreachable: no answer from the server at all (refused, reset, closed, timed out).
func unreachable(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}
