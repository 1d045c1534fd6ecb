"""A small typed client for the idempotency extension's SQL functions (psycopg 3).

`Idempotency` runs on a `psycopg.Connection`, `AsyncIdempotency` on a
`psycopg.AsyncConnection`; both take the connection per call, so they work with a
pool, inside the caller's transaction or in autocommit, and never commit themselves.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Sequence
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from .errors import UnsupportedByExtension, translate


class Outcome(str, enum.Enum):
    CLAIMED = "claimed"
    RECLAIMED = "reclaimed"
    REPLAY = "replay"
    IN_PROGRESS = "in_progress"
    MISMATCH = "mismatch"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Claim:
    """One row of idem_claim. `response_body_text` is the stored body in jsonb's text
    form (what a byte-for-byte replay sends); `retry_after` is the whole seconds (at
    least 1) until the owner's lease ends, for `in_progress`."""

    outcome: Outcome
    token: UUID | None
    http_status: int | None
    response_status: int | None
    response_headers: dict[str, Any] | None
    response_body_text: str | None
    recovery_point: str | None
    recovery_data: Any
    attempts: int | None
    expires_at: datetime | None
    locked_until: datetime | None
    retry_after: int | None

    @property
    def owned(self) -> bool:
        """True when this caller now owns the key (claimed or reclaimed)."""
        return self.outcome in (Outcome.CLAIMED, Outcome.RECLAIMED)

    @property
    def response_body(self) -> Any:
        return None if self.response_body_text is None else json.loads(self.response_body_text)


@dataclass(frozen=True)
class Record:
    """The live row of idempotency.keys (idem_lookup)."""

    scope: str
    key: str
    fingerprint: str | None
    status: str
    token: UUID | None
    attempts: int
    locked_until: datetime | None
    recovery_point: str | None
    recovery_data: Any
    response_status: int | None
    response_headers: dict[str, Any] | None
    response_body: Any
    created_at: datetime | None
    updated_at: datetime | None
    completed_at: datetime | None
    expires_at: datetime | None


@dataclass(frozen=True)
class Features:
    """What the installed extension offers beyond the first round of the contract."""

    version: str | None
    claim_wait: bool
    claim_token: bool
    seen_many: bool


FEATURES_SQL = """
SELECT (SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
       coalesce(bool_or('wait' = ANY(p.proargnames)) FILTER (WHERE p.proname = 'idem_claim'), false),
       coalesce(bool_or('token' = ANY(p.proargnames)) FILTER (WHERE p.proname = 'idem_claim'), false),
       coalesce(bool_or(p.proname = 'idem_seen_many'), false)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'idempotency'"""

# jsonb columns are read as text and parsed here: connections may carry their own jsonb
# loaders (Django's returns text), so the client does not depend on them.
CLAIM_COLUMNS = """c.outcome, c.token, c.http_status, c.response_status, c.response_headers::text,
       c.response_body::text, c.recovery_point, c.recovery_data::text, c.attempts, c.expires_at,
       c.locked_until,
       CASE WHEN c.outcome = 'in_progress' THEN
            greatest(1, ceil(extract(epoch FROM c.locked_until - clock_timestamp())))::int END"""

RECORD_COLUMNS = ("scope, key, fingerprint, status::text, token, attempts, locked_until, recovery_point, "
                  "recovery_data::text, response_status, response_headers::text, response_body::text, created_at, "
                  "updated_at, completed_at, expires_at")


def claim_statement(features: Features, scope: str, key: str, fingerprint: str | None,
                    ttl: timedelta | None, lease: timedelta | None,
                    wait: timedelta | None, token: UUID | None) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"scope": scope, "key": key, "fp": fingerprint, "ttl": ttl, "lease": lease}
    args = "%(scope)s, %(key)s, %(fp)s::text, ttl => %(ttl)s::interval, lease => %(lease)s::interval"
    if wait is not None:
        if not features.claim_wait:
            raise UnsupportedByExtension(
                f"idem_claim(wait => ...) needs a newer extension (installed: {features.version})")
        args += ", wait => %(wait)s::interval"
        params["wait"] = wait
    if token is not None:
        if not features.claim_token:
            raise UnsupportedByExtension(
                f"idem_claim(token => ...) needs a newer extension (installed: {features.version})")
        args += ", token => %(token)s::uuid"
        params["token"] = token
    return f"SELECT {CLAIM_COLUMNS} FROM idempotency.idem_claim({args}) AS c", params


def _parse(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def claim_from_row(row: Sequence[Any]) -> Claim:
    r = list(row)
    r[0], r[4], r[7] = Outcome(r[0]), _parse(r[4]), _parse(r[7])
    return Claim(*r)


def record_from_row(row: Sequence[Any] | None) -> Record | None:
    if row is None:
        return None
    r = list(row)
    r[8], r[10], r[11] = _parse(r[8]), _parse(r[10]), _parse(r[11])
    return Record(*r)


COMPLETE_SQL = ("SELECT %(body)s::jsonb::text FROM idempotency.idem_complete("
                "%(scope)s, %(key)s, %(token)s::uuid, %(status)s::int, %(body)s::jsonb, %(headers)s::jsonb)")
# Two statements in one simple-protocol string (the arguments quoted by psycopg's client-side
# binding, libpq's escaping): the statements after a failed one are not run, so a completion
# that fails never commits.
COMPLETE_AND_COMMIT_SQL = (
    "SELECT stored.body::text FROM (SELECT %(body)s::jsonb AS body) AS stored, idempotency.idem_complete("
    "%(scope)s, %(key)s, %(token)s::uuid, %(status)s::int, stored.body, %(headers)s::jsonb); COMMIT")
CHECKPOINT_SQL = ("SELECT idempotency.idem_checkpoint(%s, %s, %s::uuid, %s, %s::jsonb, %s::interval)")
RELEASE_SQL = "SELECT idempotency.idem_release(%s, %s, %s::uuid)"
LOOKUP_SQL = f"SELECT {RECORD_COLUMNS} FROM idempotency.idem_lookup(%s, %s)"
SEEN_SQL = "SELECT idempotency.idem_seen(%s, %s, %s::interval)"
SEEN_MANY_SQL = "SELECT idempotency.idem_seen_many(%s, %s::text[], %s::interval)"
FINGERPRINT_SQL = "SELECT idempotency.idem_fingerprint(%s::jsonb, %s::text[])"


def complete_params(scope: str, key: str, token: UUID, status: int, body_json: str | None,
                    headers: dict[str, Any] | None) -> dict[str, Any]:
    """`body_json` is JSON text (stored as jsonb); idem_complete's call also returns it in
    jsonb's text form, which is what every replay will send."""
    return {"scope": scope, "key": key, "token": token, "status": status, "body": body_json,
            "headers": None if headers is None else Jsonb(headers)}


def _json(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


class Idempotency:
    """Synchronous client. Each method takes the connection to run on."""

    def __init__(self) -> None:
        self._features: Features | None = None

    @property
    def known_features(self) -> Features | None:
        """The features once detected (by the first call), else None."""
        return self._features

    def _run(self, conn: psycopg.Connection, sql: str, params: Any) -> tuple[Any, ...] | None:
        try:
            return conn.execute(sql, params).fetchone()
        except psycopg.Error as e:
            raise translate(e) from e

    def features(self, conn: psycopg.Connection) -> Features:
        if self._features is None:
            self._features = Features(*self._run(conn, FEATURES_SQL, ()))  # type: ignore[misc]
        return self._features

    def claim(self, conn: psycopg.Connection, scope: str, key: str, fingerprint: str | None = None, *,
              ttl: timedelta | None = None, lease: timedelta | None = None,
              wait: timedelta | None = None, token: UUID | None = None) -> Claim:
        sql, params = claim_statement(self.features(conn), scope, key, fingerprint, ttl, lease, wait, token)
        return claim_from_row(self._run(conn, sql, params))  # type: ignore[arg-type]

    def complete(self, conn: psycopg.Connection, scope: str, key: str, token: UUID, status: int,
                 body: Any = None, headers: dict[str, Any] | None = None, *,
                 body_json: str | None = None) -> str | None:
        """Stores the response. Give the body as a value (`body`) or as JSON text
        (`body_json`). Returns the stored body in jsonb's text form."""
        text = body_json if body_json is not None else (None if body is None else json.dumps(body))
        row = self._run(conn, COMPLETE_SQL, complete_params(scope, key, token, status, text, headers))
        return row[0]  # type: ignore[index]

    def complete_and_commit(self, conn: psycopg.Connection, scope: str, key: str, token: UUID, status: int,
                            headers: dict[str, Any] | None, body_json: str | None) -> str | None:
        """idem_complete and `COMMIT` in one round trip, in a transaction already open. When
        the completion fails, COMMIT is not run and the transaction stays open (aborted) for
        the caller's rollback."""
        cur = psycopg.ClientCursor(conn)
        try:
            cur.execute(COMPLETE_AND_COMMIT_SQL, complete_params(scope, key, token, status, body_json, headers))
            return cur.fetchone()[0]  # type: ignore[index]
        except psycopg.Error as e:
            raise translate(e) from e

    def checkpoint(self, conn: psycopg.Connection, scope: str, key: str, token: UUID, recovery_point: str,
                   recovery_data: Any = None, lease: timedelta | None = None) -> datetime:
        row = self._run(conn, CHECKPOINT_SQL, (scope, key, token, recovery_point, _json(recovery_data), lease))
        return row[0]  # type: ignore[index]

    def release(self, conn: psycopg.Connection, scope: str, key: str, token: UUID) -> bool:
        return self._run(conn, RELEASE_SQL, (scope, key, token))[0]  # type: ignore[index]

    def lookup(self, conn: psycopg.Connection, scope: str, key: str) -> Record | None:
        return record_from_row(self._run(conn, LOOKUP_SQL, (scope, key)))

    def seen(self, conn: psycopg.Connection, scope: str, message_id: str, ttl: timedelta | None = None) -> bool:
        return self._run(conn, SEEN_SQL, (scope, message_id, ttl))[0]  # type: ignore[index]

    def seen_many(self, conn: psycopg.Connection, scope: str, message_ids: Sequence[str],
                  ttl: timedelta | None = None) -> list[bool]:
        if not self.features(conn).seen_many:
            raise UnsupportedByExtension(
                f"idem_seen_many needs a newer extension (installed: {self.features(conn).version})")
        return list(self._run(conn, SEEN_MANY_SQL, (scope, list(message_ids), ttl))[0])  # type: ignore[index]

    def fingerprint(self, conn: psycopg.Connection, payload: Any, ignore: Sequence[str] = ()) -> str:
        """idem_fingerprint computed by the server (see `fingerprint.fingerprint_json` for the
        same value computed here)."""
        return self._run(conn, FINGERPRINT_SQL, (Jsonb(payload), list(ignore) or None))[0]  # type: ignore[index]


class AsyncIdempotency:
    """The same client for `psycopg.AsyncConnection`."""

    def __init__(self) -> None:
        self._features: Features | None = None

    @property
    def known_features(self) -> Features | None:
        """The features once detected (by the first call), else None."""
        return self._features

    async def _run(self, conn: psycopg.AsyncConnection, sql: str, params: Any) -> tuple[Any, ...] | None:
        try:
            cur = await conn.execute(sql, params)
            return await cur.fetchone()
        except psycopg.Error as e:
            raise translate(e) from e

    async def features(self, conn: psycopg.AsyncConnection) -> Features:
        if self._features is None:
            self._features = Features(*await self._run(conn, FEATURES_SQL, ()))  # type: ignore[misc]
        return self._features

    async def claim(self, conn: psycopg.AsyncConnection, scope: str, key: str, fingerprint: str | None = None, *,
                    ttl: timedelta | None = None, lease: timedelta | None = None,
                    wait: timedelta | None = None, token: UUID | None = None) -> Claim:
        sql, params = claim_statement(await self.features(conn), scope, key, fingerprint, ttl, lease, wait, token)
        return claim_from_row(await self._run(conn, sql, params))  # type: ignore[arg-type]

    async def complete(self, conn: psycopg.AsyncConnection, scope: str, key: str, token: UUID, status: int,
                       body: Any = None, headers: dict[str, Any] | None = None, *,
                       body_json: str | None = None) -> str | None:
        text = body_json if body_json is not None else (None if body is None else json.dumps(body))
        row = await self._run(conn, COMPLETE_SQL, complete_params(scope, key, token, status, text, headers))
        return row[0]  # type: ignore[index]

    async def begin_and_claim(self, conn: psycopg.AsyncConnection, scope: str, key: str,
                              fingerprint: str | None = None, *, ttl: timedelta | None = None,
                              lease: timedelta | None = None, wait: timedelta | None = None,
                              token: UUID | None = None) -> Claim:
        """`BEGIN` and the claim in one round trip, on an autocommit connection. The
        transaction stays open, also when the claim fails (then aborted): the caller ends it
        (`complete_and_commit`, or `conn.rollback()`)."""
        sql, params = claim_statement(await self.features(conn), scope, key, fingerprint, ttl, lease, wait, token)
        cur = psycopg.AsyncClientCursor(conn)
        try:
            await cur.execute("BEGIN; " + sql, params)
            cur.nextset()
            return claim_from_row(await cur.fetchone())  # type: ignore[arg-type]
        except psycopg.Error as e:
            raise translate(e) from e

    async def complete_and_commit(self, conn: psycopg.AsyncConnection, scope: str, key: str, token: UUID,
                                  status: int, headers: dict[str, Any] | None, body_json: str | None) -> str | None:
        """idem_complete and `COMMIT` in one round trip. When the completion fails, COMMIT is
        not run and the transaction stays open (aborted) for the caller's rollback; an error
        without a SQLSTATE (the connection lost) leaves the commit's outcome unknown."""
        cur = psycopg.AsyncClientCursor(conn)
        try:
            await cur.execute(COMPLETE_AND_COMMIT_SQL, complete_params(scope, key, token, status, body_json, headers))
            return (await cur.fetchone())[0]  # type: ignore[index]
        except psycopg.Error as e:
            raise translate(e) from e

    async def checkpoint(self, conn: psycopg.AsyncConnection, scope: str, key: str, token: UUID,
                         recovery_point: str, recovery_data: Any = None, lease: timedelta | None = None) -> datetime:
        row = await self._run(conn, CHECKPOINT_SQL, (scope, key, token, recovery_point, _json(recovery_data), lease))
        return row[0]  # type: ignore[index]

    async def release(self, conn: psycopg.AsyncConnection, scope: str, key: str, token: UUID) -> bool:
        return (await self._run(conn, RELEASE_SQL, (scope, key, token)))[0]  # type: ignore[index]

    async def lookup(self, conn: psycopg.AsyncConnection, scope: str, key: str) -> Record | None:
        return record_from_row(await self._run(conn, LOOKUP_SQL, (scope, key)))

    async def seen(self, conn: psycopg.AsyncConnection, scope: str, message_id: str,
                   ttl: timedelta | None = None) -> bool:
        return (await self._run(conn, SEEN_SQL, (scope, message_id, ttl)))[0]  # type: ignore[index]

    async def seen_many(self, conn: psycopg.AsyncConnection, scope: str, message_ids: Sequence[str],
                        ttl: timedelta | None = None) -> list[bool]:
        features = await self.features(conn)
        if not features.seen_many:
            raise UnsupportedByExtension(f"idem_seen_many needs a newer extension (installed: {features.version})")
        return list((await self._run(conn, SEEN_MANY_SQL, (scope, list(message_ids), ttl)))[0])  # type: ignore[index]

    async def fingerprint(self, conn: psycopg.AsyncConnection, payload: Any, ignore: Sequence[str] = ()) -> str:
        return (await self._run(conn, FINGERPRINT_SQL, (Jsonb(payload), list(ignore) or None)))[0]  # type: ignore[index]
