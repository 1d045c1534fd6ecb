"""The extension's SQLSTATEs as exception classes.

Every error a client call raises for one of the documented SQLSTATEs is an
`IdempotencyError` subclass carrying the original psycopg error as `__cause__`
and its `sqlstate`.
"""

from __future__ import annotations

import psycopg


class IdempotencyError(Exception):
    """Base class; `sqlstate` is the server's code (None for client-side errors)."""

    sqlstate: str | None = None

    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        if sqlstate is not None:
            self.sqlstate = sqlstate


class NullArgument(IdempotencyError):
    """22004: an argument is NULL where a value is required."""

    sqlstate = "22004"


class InvalidArgument(IdempotencyError):
    """22023: a bad argument value (empty or too long key, bad ttl/lease/status ...)."""

    sqlstate = "22023"


class ResponseTooLarge(IdempotencyError):
    """54000: response or checkpoint larger than idempotency.max_response_size."""

    sqlstate = "54000"


class NoLiveRecord(IdempotencyError):
    """IK001: no live record for (scope, key): never claimed, released or expired."""

    sqlstate = "IK001"


class NotOwner(IdempotencyError):
    """IK002: the token no longer owns the record. Do not report success."""

    sqlstate = "IK002"


class AlreadyCompleted(IdempotencyError):
    """IK003: the record is already completed by this token."""

    sqlstate = "IK003"


class ReadOnlyServer(IdempotencyError):
    """25006: a write function was called on a hot standby."""

    sqlstate = "25006"


class SerializationFailure(IdempotencyError):
    """40001: retry the transaction."""

    sqlstate = "40001"


class LockTimeout(IdempotencyError):
    """55P03: lock_timeout ran out while a claim waited behind another transaction's claim."""

    sqlstate = "55P03"


class PermissionDenied(IdempotencyError):
    """42501: the role lacks the grants, or row-level security refused the scope."""

    sqlstate = "42501"


class UnsupportedByExtension(IdempotencyError):
    """The installed extension lacks a second-round argument or function (wait, token,
    idem_seen_many): raised on the client side, before anything is sent."""


BY_SQLSTATE: dict[str, type[IdempotencyError]] = {
    cls.sqlstate: cls  # type: ignore[misc]
    for cls in (NullArgument, InvalidArgument, ResponseTooLarge, NoLiveRecord, NotOwner,
                AlreadyCompleted, ReadOnlyServer, SerializationFailure, LockTimeout,
                PermissionDenied)
}


# The server going away, shutting down, starting up or full: the request can be repeated later.
UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def unavailable(error: BaseException | None) -> bool:
    """Whether an error (or one it was raised from, as Django's database errors wrap
    psycopg's) means the database could not be reached: a connection refused or reset, a pool
    that gave no connection in time (psycopg_pool's PoolTimeout), a server shutting down,
    starting up or out of connections. Then nothing was done, and 503 with Retry-After is the
    answer."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, psycopg.OperationalError):
            code = error.sqlstate
            if code is None or code.startswith("08") or code in UNAVAILABLE_SQLSTATES:
                return True
        if isinstance(error, psycopg.InterfaceError):  # a connection already closed
            return True
        error, seen = error.__cause__, seen + 1
    return False


def ended_uncommitted(error: BaseException) -> bool:
    """Whether the server ended the session while a statement ran, and the statement's
    transaction therefore did not commit: 57P01 (a fast or smart shutdown, pg_terminate_backend).
    The server acts on it only where the transaction can still roll back: never inside a commit,
    and a COMMIT's own answer goes out before the next such check. (A crash, 57P02, or a
    connection that just ended, can come after the commit: its outcome is unknown.)"""
    return getattr(error, "sqlstate", None) == "57P01"


def translate(error: psycopg.Error) -> Exception:
    """The typed exception for a psycopg error, or the error itself when its SQLSTATE is
    not one of the extension's documented codes."""
    cls = BY_SQLSTATE.get(error.sqlstate or "")
    if cls is None:
        return error
    diag = error.diag.message_primary or str(error)
    return cls(diag, error.sqlstate)
