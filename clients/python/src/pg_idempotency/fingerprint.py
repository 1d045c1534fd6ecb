"""The request fingerprint, computed here exactly as idem_fingerprint computes it:
'sha256:' + hex of the RFC 8785 canonical JSON (rfc8785 library), with the given
top-level fields left out. A body that is not JSON, or that RFC 8785 cannot represent
(NaN, numbers beyond the double range), is fingerprinted as raw bytes, like
idem_fingerprint(bytea)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

import rfc8785

_MAX_SAFE_INT = 2**53 - 1


class NotJson(ValueError):
    pass


def _no_constants(name: str) -> Any:
    raise NotJson(f"{name} is not JSON")


def parse_json(body: bytes) -> Any:
    """Strict JSON (no NaN / Infinity); raises NotJson."""
    try:
        return json.loads(body, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as e:
        raise NotJson(str(e)) from e


def _as_ecmascript(value: Any) -> Any:
    """Integers beyond 2^53 are doubles in RFC 8785 (as in the extension); the rfc8785
    library refuses them as ints, so they are handed over as floats."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) > _MAX_SAFE_INT:
        return float(value)
    if isinstance(value, dict):
        return {k: _as_ecmascript(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_ecmascript(v) for v in value]
    return value


def fingerprint_json(value: Any, ignore: Iterable[str] = ()) -> str:
    """idem_fingerprint(value::jsonb, ignore) for a parsed JSON value."""
    ignored = set(ignore)
    if ignored and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in ignored}
    canonical = rfc8785.dumps(_as_ecmascript(value))
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def fingerprint_bytes(body: bytes) -> str:
    """idem_fingerprint(body::bytea)."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def fingerprint_body(body: bytes, ignore: Iterable[str] = ()) -> str:
    """The fingerprint of a request body: canonical JSON when it is JSON, else its bytes."""
    try:
        return fingerprint_json(parse_json(body), ignore)
    except (NotJson, rfc8785.CanonicalizationError):
        return fingerprint_bytes(body)
