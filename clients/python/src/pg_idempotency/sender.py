"""The sending side (docs/sending.md): send a request to another service with an
Idempotency-Key that is made once per business operation and kept in your database.

    key = prepare(conn, "shop", "order-42:charge", "payments", {"order": "order-42", "amount": 500})
    # ... in the same transaction as the order; after COMMIT:
    result = sender.deliver("shop", "order-42:charge")     # the inline path: one attempt
    # and a worker process sends whatever is due, with backoff, jitter and the budget:
    Sender(conninfo, urls={"payments": "https://pay.example/charges"}).run("payments")

`prepare` runs in the caller's transaction (it never commits). `Sender` keeps its own
connections (autocommit): one for the extension's calls, one that LISTENs. HTTP goes
through httpx (the `sender` extra), or through a function of yours (`send=`).
"""

from __future__ import annotations

import email.utils
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Union
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

CHANNEL = "idempotency_send"


# --- what the application gets ------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """The row idem_send recorded (or found: the same operation prepared before)."""

    key: str
    state: str
    attempts: int
    next_attempt_at: datetime | None
    response: Delivered | None


@dataclass(frozen=True)
class Delivered:
    """The receiver's final answer (any status that is not retried, 4xx included)."""

    status: int
    headers: dict[str, str]
    body: str | None

    def json(self) -> Any:
        return None if self.body is None else json.loads(self.body)


@dataclass(frozen=True)
class NotYet:
    """No final answer yet: `pending` (a retry is due at `next_attempt_at`) or `sending`
    (another sender holds it now). A worker finishes it."""

    state: str
    attempts: int
    next_attempt_at: datetime | None
    last_status: int | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class Unknown:
    """`gave_up`: no final answer came before give_up_at. The receiver may or may not have
    done the work: look it up there by the key; never send the operation again with a new key."""

    key: str
    attempts: int
    last_status: int | None
    last_error: str | None


@dataclass(frozen=True)
class Lost:
    """This sender's lease ended and another sender took the send over (IK002): its result
    was not recorded, the other sender's will be."""

    scope: str
    operation: str


Result = Union[Delivered, NotYet, Unknown, Lost]


@dataclass(frozen=True)
class Attempt:
    """One send handed out by idem_send_next."""

    scope: str
    operation: str
    target: str
    key: str
    request: Any
    attempt: int
    token: UUID
    locked_until: datetime
    give_up_at: datetime


@dataclass(frozen=True)
class Answer:
    """What one HTTP attempt got: `status` None means no answer (`error` says why)."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    error: str | None = None

    def retry_after(self, now: datetime | None = None) -> timedelta | None:
        return parse_retry_after(self.headers.get("retry-after"), now)


SendFunction = Callable[[Attempt], Answer]


# --- the pure rules ------------------------------------------------------------------------

def key_header(key: str) -> str:
    """The Idempotency-Key header's value: an RFC 8941 sf-string."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


# A longer Retry-After is read as this: past any give_up_at, and within what an interval holds.
MAX_RETRY_AFTER = timedelta(days=365_000)


def parse_retry_after(value: str | None, now: datetime | None = None) -> timedelta | None:
    """Retry-After as delta-seconds or an HTTP date (at most MAX_RETRY_AFTER); None when
    absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(timedelta(seconds=min(int(value), int(MAX_RETRY_AFTER.total_seconds()))), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return min(max(when - (now or datetime.now(timezone.utc)), timedelta(0)), MAX_RETRY_AFTER)


# --- the caller's transaction --------------------------------------------------------------

_SEND = ("SELECT key, state, attempts, next_attempt_at, response_status, response_body, response_headers "
         "FROM idempotency.idem_send(%s, %s, %s, %s, %s, %s)")


def _prepared(row) -> Prepared:
    key, state, attempts, next_at, status, body, headers = row
    response = Delivered(status, dict(headers or {}), body) if state == "done" else None
    return Prepared(key, state, attempts, next_at, response)


def prepare(conn: psycopg.Connection, scope: str, operation: str, target: str, request: Any = None,
            *, key: str | None = None, give_up_after: timedelta | None = None) -> Prepared:
    """Records the send in the caller's open transaction (never commits) and returns its key.
    Called again for the same operation it returns the same row."""
    row = conn.execute(_SEND, (scope, operation, target, None if request is None else Jsonb(request),
                               key, give_up_after)).fetchone()
    return _prepared(row)


async def aprepare(conn: psycopg.AsyncConnection, scope: str, operation: str, target: str, request: Any = None,
                   *, key: str | None = None, give_up_after: timedelta | None = None) -> Prepared:
    """`prepare` on an AsyncConnection."""
    cur = await conn.execute(_SEND, (scope, operation, target, None if request is None else Jsonb(request),
                                     key, give_up_after))
    return _prepared(await cur.fetchone())


# --- the sender ----------------------------------------------------------------------------

_NEXT = ("SELECT scope, operation, target, key, request, attempt, token, locked_until, give_up_at "
         "FROM idempotency.idem_send_next(target => %s, max_rows => %s, lease => %s, scope => %s, operation => %s)")
_RESULT = ("SELECT state, attempts, next_attempt_at FROM idempotency.idem_send_result(%s, %s, %s, %s, %s, %s, %s, %s)")
_ROW = ("SELECT state, attempts, next_attempt_at, last_status, last_error, response_status, response_body, "
        "response_headers, key FROM idempotency.outbound WHERE scope = %s AND operation = %s")


class Sender:
    """Sends due requests: `deliver` (one operation, right after COMMIT) and `run` (a worker).

    `urls` maps a target to the URL its requests are POSTed to (the request as JSON, with the
    target's extra `headers`, e.g. its credentials), or `send` is your own function (an
    Attempt in, an Answer out; raise nothing, return Answer(None, error=...) for no answer).
    `timeout` bounds one HTTP attempt and must stay below `lease`, the time a sender holds a
    send before another may take it over. `on_attempt` is called after each attempt,
    `on_finished` when an attempt's result finished the send (done, or gave_up at that
    result). A send whose give_up_at passes while it waits for its retry is marked gave_up by
    idem_send_next without an attempt: `status` (or the outbound row) tells.
    """

    def __init__(self, conninfo: str, *, urls: Mapping[str, str] | None = None,
                 send: SendFunction | None = None, headers: Mapping[str, Mapping[str, str]] | None = None,
                 timeout: float = 10.0, lease: timedelta = timedelta(seconds=30), concurrency: int = 4,
                 poll_interval: float = 1.0,
                 on_attempt: Callable[[Attempt, Answer], None] | None = None,
                 on_finished: Callable[[Attempt, Result], None] | None = None):
        if send is None and not urls:
            raise ValueError("give urls (a URL per target) or send (a function)")
        if timeout >= lease.total_seconds():
            raise ValueError("timeout must be shorter than the lease")
        self._conninfo = conninfo
        self._urls = dict(urls or {})
        self._headers = {t: dict(h) for t, h in (headers or {}).items()}
        self._send = send or self._http_send
        self._timeout = timeout
        self._lease = lease
        self._concurrency = max(1, concurrency)
        self._poll_interval = poll_interval
        self._on_attempt = on_attempt
        self._on_finished = on_finished
        self._conn: psycopg.Connection | None = None
        self._http = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # connections ---------------------------------------------------------------------

    def _db(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
        return self._conn

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self._conn is not None:
            self._conn.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # one attempt ---------------------------------------------------------------------

    def _http_send(self, attempt: Attempt) -> Answer:
        import httpx  # the `sender` extra

        url = self._urls.get(attempt.target)
        if url is None:
            return Answer(None, error=f"no URL for target {attempt.target!r}")
        if self._http is None:
            self._http = httpx.Client(timeout=self._timeout)
        body = b"null" if attempt.request is None else json.dumps(attempt.request).encode()
        try:
            r = self._http.post(url, content=body, headers={**self._headers.get(attempt.target, {}),
                                                           "Idempotency-Key": key_header(attempt.key),
                                                           "Content-Type": "application/json"})
        except httpx.TimeoutException:
            return Answer(None, error="timed out")
        except httpx.ConnectError as e:
            return Answer(None, error=f"connection failed: {e}")
        except httpx.TransportError as e:
            return Answer(None, error=f"no answer: {e}")
        return Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.text)

    def attempt(self, attempt: Attempt) -> Result:
        """One HTTP attempt of a send this sender holds, and its result recorded."""
        try:
            answer = self._send(attempt)
        except Exception as e:  # the application's own send function failed: no answer
            answer = Answer(None, error=f"{type(e).__name__}: {e}")
        if self._on_attempt:
            self._on_attempt(attempt, answer)
        return self._record(attempt, answer)

    def _record(self, attempt: Attempt, answer: Answer) -> Result:
        headers = Jsonb(answer.headers) if answer.status is not None else None
        with self._lock:
            try:
                state, attempts, next_at = self._db().execute(_RESULT, (
                    attempt.scope, attempt.operation, attempt.token, answer.status, answer.body, headers,
                    answer.retry_after(), answer.error)).fetchone()
            except psycopg.Error as e:
                if e.sqlstate == "IK002":
                    return Lost(attempt.scope, attempt.operation)
                raise
        if state == "done":
            result: Result = Delivered(answer.status, answer.headers, answer.body)
        elif state == "gave_up":
            result = Unknown(attempt.key, attempts, answer.status, answer.error)
        else:
            result = NotYet(state, attempts, next_at, answer.status, answer.error)
        if self._on_finished and not isinstance(result, NotYet):
            self._on_finished(attempt, result)
        return result

    def _take(self, target: str | None, max_rows: int, scope: str | None = None,
              operation: str | None = None) -> list[Attempt]:
        with self._lock:
            rows = self._db().execute(_NEXT, (target, max_rows, self._lease, scope, operation)).fetchall()
        return [Attempt(*row) for row in rows]

    # the inline path -------------------------------------------------------------------

    def deliver(self, scope: str, operation: str) -> Result:
        """Right after the COMMIT that prepared it: one attempt of this send, if it is due and
        no other sender holds it; otherwise (or after a retryable answer) what it is now.
        The retries are the worker's."""
        taken = self._take(None, 1, scope, operation)
        if taken:
            return self.attempt(taken[0])
        return self.status(scope, operation)

    def status(self, scope: str, operation: str) -> Result:
        """Where the send is now, from its row."""
        with self._lock:
            row = self._db().execute(_ROW, (scope, operation)).fetchone()
        if row is None:
            raise LookupError(f"no outbound record for operation {operation!r} in scope {scope!r}")
        state, attempts, next_at, last_status, last_error, status, body, headers, key = row
        if state == "done":
            return Delivered(status, dict(headers or {}), body)
        if state == "gave_up":
            return Unknown(key, attempts, last_status, last_error)
        return NotYet(state, attempts, next_at, last_status, last_error)

    # the worker ------------------------------------------------------------------------

    def run_once(self, target: str | None = None) -> int:
        """One round: takes up to `concurrency` due sends, attempts them at once, records
        each answer. Returns how many it attempted."""
        taken = self._take(target, self._concurrency)
        if len(taken) == 1:
            self.attempt(taken[0])
        elif taken:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="idempotency-sender")
            list(self._pool.map(self.attempt, taken))
        return len(taken)

    def idle(self, target: str | None = None) -> bool:
        """No send of `target` (of any target: None) is pending or sending."""
        with self._lock:
            return self._db().execute(
                "SELECT NOT EXISTS (SELECT FROM idempotency.outbound WHERE state IN ('pending', 'sending') "
                "AND (%s::text IS NULL OR target = %s))", (target, target)).fetchone()[0]

    def run(self, target: str | None = None, *, stop: threading.Event | None = None,
            until_idle: bool = False) -> None:
        """The worker: rounds of `run_once` while there is due work; between them it waits
        for a NOTIFY on idempotency_send (a send committed) or `poll_interval` (retries that
        become due), whichever first. Stops when `stop` is set (after the attempts in flight
        are recorded) or, with `until_idle`, when nothing of the target is left to send."""
        stop = stop or threading.Event()
        listener = psycopg.connect(self._conninfo, autocommit=True)
        try:
            listener.execute(f"LISTEN {CHANNEL}")
            while not stop.is_set():
                if self.run_once(target):
                    continue
                if until_idle and self.idle(target):
                    return
                for _ in listener.notifies(timeout=self._poll_interval, stop_after=1):
                    pass
        finally:
            listener.close()
