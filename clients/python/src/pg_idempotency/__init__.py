"""Idempotency keys for Python web applications on the `idempotency` PostgreSQL extension."""

from .client import AsyncIdempotency, Claim, Features, Idempotency, Outcome, Record
from .errors import (AlreadyCompleted, IdempotencyError, InvalidArgument, LockTimeout, NoLiveRecord, NotOwner,
                     NullArgument, PermissionDenied, ReadOnlyServer, ResponseTooLarge, SerializationFailure,
                     UnsupportedByExtension)
from .fingerprint import fingerprint_body, fingerprint_bytes, fingerprint_json
from .http import COMMITTED_FIRST, SAME_TRANSACTION, Refused, RoutePolicy, parse_key

__all__ = [
    "AsyncIdempotency", "Claim", "Features", "Idempotency", "Outcome", "Record",
    "AlreadyCompleted", "IdempotencyError", "InvalidArgument", "LockTimeout", "NoLiveRecord", "NotOwner",
    "NullArgument", "PermissionDenied", "ReadOnlyServer", "ResponseTooLarge", "SerializationFailure",
    "UnsupportedByExtension", "fingerprint_body", "fingerprint_bytes", "fingerprint_json",
    "COMMITTED_FIRST", "SAME_TRANSACTION", "Refused", "RoutePolicy", "parse_key",
]
