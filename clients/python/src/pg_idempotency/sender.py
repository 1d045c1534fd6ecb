"""The sending side (docs/sending.md): send a request to another service with an
Idempotency-Key that is made once per business operation and kept in your database.

    key = prepare(conn, "shop", "order-42:charge", "payments", {"order": "order-42", "amount": 500})
    # ... in the same transaction as the order; after COMMIT:
    result = sender.deliver("shop", "order-42:charge")     # the inline path: one attempt
    # and a worker process sends whatever is due, with backoff, jitter and the budget:
    Sender(conninfo, urls={"payments": "https://pay.example/charges"}).run("payments")

`prepare` runs in the caller's transaction (it never commits). `Sender` keeps its own
connections (autocommit): one for the extension's calls, one that LISTENs. HTTP goes
through httpcore (the `sender` extra), each attempt bounded in total by the sender's
`timeout` (pg_idempotency.bounded_http), or through a function of yours (`send=`).

The worker (`Sender.run`) outlives its database: on any database error it logs it (logger
`pg_idempotency.sender`), reconnects with exponential backoff and full jitter, and goes on.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Union
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

CHANNEL = "idempotency_send"

log = logging.getLogger("pg_idempotency.sender")


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


def check_timeout(timeout: float, lease: timedelta) -> None:
    """A sender's timeout bounds each attempt and must end before the lease does: an attempt
    that outlives its lease runs beside the attempt of the sender that took the send over."""
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds (got {timeout!r})")
    if timeout >= lease.total_seconds():
        raise ValueError(f"timeout ({timeout:g} s) must be below the lease ({lease.total_seconds():g} s): an attempt "
                         "that outlives its lease runs beside the attempt of the sender that takes the send over")


# The extension's limits of its settings (docs/reference.md): a budget of at most 1,000,000,
# intervals of at most 10000 years, which PostgreSQL compares as 120000 months of 30 days.
MAX_RETRY_BUDGET = 1_000_000.0
MAX_INTERVAL = timedelta(days=10_000 * 12 * 30)


def check_interval(name: str, value: timedelta) -> timedelta:
    if not (timedelta(0) < value <= MAX_INTERVAL):
        raise ValueError(f"{name} must be a positive interval of at most 10000 years (got {value!r})")
    return value


def interval_text(value: timedelta) -> str:
    """An interval setting's value, exact to the microsecond."""
    return f"{value.days * 86400 + value.seconds}.{value.microseconds:06d} seconds"


def setting_values(retry_budget: float | None = None, backoff_base: timedelta | None = None,
                   backoff_cap: timedelta | None = None) -> dict[str, str]:
    """The extension's settings a sender sets in each of its transactions (checked here: a
    value the database refuses would fail every call); those not given stay the database's."""
    values: dict[str, str] = {}
    if retry_budget is not None:
        if not (isinstance(retry_budget, (int, float)) and 0 <= retry_budget <= MAX_RETRY_BUDGET):
            raise ValueError(f"retry_budget must be a number from 0 to {MAX_RETRY_BUDGET:g} (got {retry_budget!r})")
        values["idempotency.send_retry_budget"] = repr(float(retry_budget))
    for name, value in (("backoff_base", backoff_base), ("backoff_cap", backoff_cap)):
        if value is not None:
            values[f"idempotency.send_{name}"] = interval_text(check_interval(name, value))
    return values


def reconnect_delay(failures: int, base: float, cap: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait after the `failures`-th database error in a row: exponential backoff
    with full jitter, anywhere from 0 to min(cap, base * 2^(failures - 1))."""
    return rand() * min(cap, base * 2 ** min(failures - 1, 60))


def error_code(error: BaseException) -> str:
    """A database error's SQLSTATE, or its class when it has none (a connection refused)."""
    return getattr(error, "sqlstate", None) or type(error).__name__


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


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
# The answers of a round, recorded in one statement (one round trip, one transaction), in the
# order given: idem_send_result once per element of the arrays.
_RESULTS = ("SELECT r.state, r.attempts, r.next_attempt_at "
            "FROM unnest(%s::text[], %s::text[], %s::uuid[], %s::int[], %s::text[], %s::jsonb[], %s::interval[], "
            "%s::text[]) WITH ORDINALITY AS a(scope, operation, token, http_status, response_body, response_headers, "
            "retry_after, error, n), "
            "LATERAL idempotency.idem_send_result(a.scope, a.operation, a.token, a.http_status, a.response_body, "
            "a.response_headers, a.retry_after, a.error) AS r ORDER BY a.n")
_ROW = ("SELECT state, attempts, next_attempt_at, last_status, last_error, response_status, response_body, "
        "response_headers, key FROM idempotency.outbound WHERE scope = %s AND operation = %s")
_IDLE = ("SELECT NOT EXISTS (SELECT FROM idempotency.outbound WHERE state IN ('pending', 'sending') "
         "AND (%s::text IS NULL OR target = %s))")


@dataclass(frozen=True)
class _Unrecorded:
    """An attempt's answer that the database went away before recording; `lease_end` is a
    time.monotonic() instant at or before the end of the attempt's lease."""

    attempt: Attempt
    answer: Answer
    lease_end: float


class Sender:
    """Sends due requests: `deliver` (one operation, right after COMMIT) and `run` (a worker).

    `urls` maps a target to the URL its requests are POSTed to (the request as JSON, with the
    target's extra `headers`, e.g. its credentials), or `send` is your own function (an
    Attempt in, an Answer out; raise nothing, return Answer(None, error=...) for no answer;
    keep it within `timeout`). `timeout` (seconds) bounds one HTTP attempt in total (connect,
    send, the whole answer) and must be below `lease`, the time a sender holds a send before
    another may take it over (ValueError otherwise). `on_attempt` is called after each
    attempt, `on_finished` when an attempt's result finished the send (done, or gave_up at
    that result). A send whose give_up_at passes while it waits for its retry is marked
    gave_up by idem_send_next without an attempt: `status` (or the outbound row) tells.

    This sender's own values of the extension's settings, the database's when None:
    `retry_budget` (idempotency.send_retry_budget), `backoff_base` and `backoff_cap`
    (idempotency.send_backoff_base / _cap), set with set_config(..., true) in each
    transaction that calls idem_send_next or idem_send_result (so they hold through
    PgBouncer in transaction mode); `give_up_after` (idempotency.send_give_up_after), given
    to idem_send by `Sender.prepare`. `reconnect_base` and `reconnect_cap` (seconds) bound
    the worker's waits between reconnections.
    """

    def __init__(self, conninfo: str, *, urls: Mapping[str, str] | None = None,
                 send: SendFunction | None = None, headers: Mapping[str, Mapping[str, str]] | None = None,
                 timeout: float = 10.0, lease: timedelta = timedelta(seconds=30), concurrency: int = 4,
                 poll_interval: float = 1.0, retry_budget: float | None = None,
                 backoff_base: timedelta | None = None, backoff_cap: timedelta | None = None,
                 give_up_after: timedelta | None = None, reconnect_base: float = 0.1, reconnect_cap: float = 5.0,
                 on_attempt: Callable[[Attempt, Answer], None] | None = None,
                 on_finished: Callable[[Attempt, Result], None] | None = None):
        if send is None and not urls:
            raise ValueError("give urls (a URL per target) or send (a function)")
        check_timeout(timeout, lease)
        self._settings = setting_values(retry_budget, backoff_base, backoff_cap)
        self._give_up_after = None if give_up_after is None else check_interval("give_up_after", give_up_after)
        self._conninfo = conninfo
        self._urls = dict(urls or {})
        self._headers = {t: dict(h) for t, h in (headers or {}).items()}
        self._timeout = timeout
        self._lease = lease
        self._concurrency = max(1, concurrency)
        self._poll_interval = poll_interval
        self._reconnect = (reconnect_base, reconnect_cap)
        self._on_attempt = on_attempt
        self._on_finished = on_finished
        self._conn: psycopg.Connection | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # the connection: one statement or transaction at a time
        self._unrecorded: list[_Unrecorded] = []
        self._unrecorded_lock = threading.Lock()
        self._http = None
        if send is None:
            try:
                from .bounded_http import BoundedClient
            except ImportError as e:  # pragma: no cover - the extra is installed in the tests
                raise ImportError("Sender(urls=...) needs the `sender` extra (httpcore): "
                                  "pip install 'pg-idempotency[sender]'") from e
            self._http = BoundedClient(max_connections=max(10, self._concurrency))
        self._send = send or self._http_send

    # connections ---------------------------------------------------------------------

    def _db(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            # No server-side prepared statements: they do not survive PgBouncer's transaction mode.
            self._conn = psycopg.connect(self._conninfo, autocommit=True, prepare_threshold=None)
        return self._conn

    def _call(self, sql: str, args: tuple) -> list[tuple]:
        """One call of the extension: with this sender's settings, in a transaction of its own."""
        with self._lock:
            conn = self._db()
            if not self._settings:
                return conn.execute(sql, args).fetchall()
            with conn.transaction():
                conn.execute("SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(self._settings)),
                             [x for pair in self._settings.items() for x in pair])
                return conn.execute(sql, args).fetchall()

    def _drop_connection(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._drop_connection()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # the caller's transaction --------------------------------------------------------

    def prepare(self, conn: psycopg.Connection, scope: str, operation: str, target: str, request: Any = None,
                *, key: str | None = None, give_up_after: timedelta | None = None) -> Prepared:
        """`prepare`, with this sender's give_up_after when none is given."""
        return prepare(conn, scope, operation, target, request, key=key,
                       give_up_after=give_up_after if give_up_after is not None else self._give_up_after)

    # one attempt ---------------------------------------------------------------------

    def _http_send(self, attempt: Attempt) -> Answer:
        from .bounded_http import NoAnswer

        url = self._urls.get(attempt.target)
        if url is None:
            return Answer(None, error=f"no URL for target {attempt.target!r}")
        body = b"null" if attempt.request is None else json.dumps(attempt.request).encode()
        headers = {**self._headers.get(attempt.target, {}), "Idempotency-Key": key_header(attempt.key),
                   "Content-Type": "application/json"}
        try:
            reply = self._http.post(url, body, headers, self._timeout)
        except NoAnswer as e:
            return Answer(None, error=str(e))
        return Answer(reply.status, reply.headers, reply.body)

    def _answer(self, attempt: Attempt) -> Answer:
        try:
            answer = self._send(attempt)
        except Exception as e:  # the application's own send function failed: no answer
            answer = Answer(None, error=f"{type(e).__name__}: {e}")
        if self._on_attempt:
            self._on_attempt(attempt, answer)
        return answer

    def attempt(self, attempt: Attempt) -> Result:
        """One HTTP attempt of a send this sender holds, and its result recorded."""
        return self._record(attempt, self._answer(attempt))

    @staticmethod
    def _result_args(attempt: Attempt, answer: Answer) -> tuple:
        headers = Jsonb(answer.headers) if answer.status is not None else None
        return (attempt.scope, attempt.operation, attempt.token, answer.status, answer.body, headers,
                answer.retry_after(), answer.error)

    def _record(self, attempt: Attempt, answer: Answer) -> Result:
        try:
            [row] = self._call(_RESULT, self._result_args(attempt, answer))
        except psycopg.Error as e:
            if e.sqlstate == "IK002":
                return Lost(attempt.scope, attempt.operation)
            if e.sqlstate != "IK003":
                raise
            # Recorded already: the COMMIT's reply was lost with the connection.
            return self.status(attempt.scope, attempt.operation)
        return self._recorded(attempt, answer, row)

    def _recorded(self, attempt: Attempt, answer: Answer, row: tuple) -> Result:
        state, attempts, next_at = row
        if state == "done":
            result: Result = Delivered(answer.status, answer.headers, answer.body)
        elif state == "gave_up":
            result = Unknown(attempt.key, attempts, answer.status, answer.error)
        else:
            result = NotYet(state, attempts, next_at, answer.status, answer.error)
        if self._on_finished and not isinstance(result, NotYet):
            self._on_finished(attempt, result)
        return result

    def _record_round(self, done: list[tuple[Attempt, Answer]]) -> list[Result]:
        """The answers of a round, recorded together: one statement, so one round trip and one
        transaction, in (scope, operation) order (so that two senders never lock rows in
        opposite orders). When the extension refuses one of them (IK002: its lease was lost;
        IK003: recorded already) the statement records none, and each is recorded on its own."""
        done = sorted(done, key=lambda d: (d[0].scope, d[0].operation))
        columns = list(zip(*(self._result_args(a, answer) for a, answer in done), strict=True))
        try:
            rows = self._call(_RESULTS, tuple(list(c) for c in columns))
        except psycopg.Error as e:
            if e.sqlstate not in ("IK002", "IK003"):
                raise
            return [self._record(a, answer) for a, answer in done]
        return [self._recorded(a, answer, row) for (a, answer), row in zip(done, rows, strict=True)]

    def _take(self, target: str | None, max_rows: int, scope: str | None = None,
              operation: str | None = None) -> tuple[list[Attempt], float]:
        """Due sends, and a time.monotonic() instant at or before the end of their lease (it
        began at the transaction's now(), after this instant)."""
        before = time.monotonic()
        rows = self._call(_NEXT, (target, max_rows, self._lease, scope, operation))
        return [Attempt(*row) for row in rows], before + self._lease.total_seconds()

    # the inline path -------------------------------------------------------------------

    def deliver(self, scope: str, operation: str) -> Result:
        """Right after the COMMIT that prepared it: one attempt of this send, if it is due and
        no other sender holds it; otherwise (or after a retryable answer) what it is now.
        The retries are the worker's. A database error is raised (the worker takes the send
        again when its lease ends)."""
        taken, _ = self._take(None, 1, scope, operation)
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

    def _attempt_kept(self, attempt: Attempt, lease_end: float) -> Result:
        """`attempt`, keeping the answer when the database fails to record it."""
        answer = self._answer(attempt)
        try:
            return self._record(attempt, answer)
        except psycopg.Error:
            with self._unrecorded_lock:
                self._unrecorded.append(_Unrecorded(attempt, answer, lease_end))
            raise

    def run_once(self, target: str | None = None) -> int:
        """One round: takes up to `concurrency` due sends, attempts them at once, and records
        their answers together once every attempt of the round has ended (one statement, one
        round trip: `_record_round`). Returns how many it attempted. A database error is raised;
        the answers it kept from being recorded are recorded by the worker when it has
        reconnected (while their lease holds)."""
        taken, lease_end = self._take(target, self._concurrency)
        if len(taken) == 1:
            self._attempt_kept(taken[0], lease_end)
        elif taken:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="idempotency-sender")
            futures = [self._pool.submit(self._answer, a) for a in taken]
            wait(futures)
            done = [(a, f.result()) for a, f in zip(taken, futures, strict=True)]
            try:
                self._record_round(done)
            except psycopg.Error:
                with self._unrecorded_lock:
                    self._unrecorded.extend(_Unrecorded(a, answer, lease_end) for a, answer in done)
                raise
        return len(taken)

    def _record_unrecorded(self) -> None:
        with self._unrecorded_lock:
            kept, self._unrecorded = self._unrecorded, []
        for i, u in enumerate(kept):
            a = u.attempt
            if time.monotonic() >= u.lease_end:
                log.info("the answer to %s / %s (attempt %d) was not recorded before its lease ended: "
                         "the send is left to be taken again", a.scope, a.operation, a.attempt)
                continue
            try:
                self._record(a, u.answer)
            except psycopg.Error:
                with self._unrecorded_lock:
                    self._unrecorded[:0] = kept[i:]
                raise
            log.info("recorded the answer to %s / %s (attempt %d) after reconnecting", a.scope, a.operation, a.attempt)

    def idle(self, target: str | None = None) -> bool:
        """No send of `target` (of any target: None) is pending or sending."""
        with self._lock:
            return self._db().execute(_IDLE, (target, target)).fetchone()[0]

    def _listen(self) -> psycopg.Connection:
        listener = psycopg.connect(self._conninfo, autocommit=True)
        try:
            listener.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            listener.close()
            raise
        return listener

    def run(self, target: str | None = None, *, stop: threading.Event | None = None,
            until_idle: bool = False) -> None:
        """The worker: rounds of `run_once` while there is due work; between them it waits
        for a NOTIFY on idempotency_send (a send committed) or `poll_interval` (retries that
        become due), whichever first. Stops when `stop` is set (after the attempts in flight
        are recorded) or, with `until_idle`, when nothing of the target is left to send.

        A database error (the backend terminated, the server restarting or down, a failover,
        a deadlock, a serialization failure) does not end it: it is logged (WARNING, with the
        psycopg error as the record's `db_error`), the connections are dropped, and after a
        wait of exponential backoff with full jitter (`reconnect_base`, `reconnect_cap`) the
        worker reconnects (INFO, the record's `db_reconnected` True), records the answers the
        error kept from being recorded while their lease holds, and goes on."""
        stop = stop or threading.Event()
        listener: psycopg.Connection | None = None
        failures = 0
        try:
            while not stop.is_set():
                try:
                    if listener is None:
                        listener = self._listen()
                        with self._lock:
                            self._db()
                        if failures:
                            log.info("reconnected to the database", extra={"db_reconnected": True})
                        self._record_unrecorded()
                    worked = self.run_once(target)
                    failures = 0
                    if worked:
                        continue
                    if until_idle and self.idle(target):
                        return
                    for _ in listener.notifies(timeout=self._poll_interval, stop_after=1):
                        pass
                except psycopg.Error as e:
                    failures += 1
                    delay = reconnect_delay(failures, *self._reconnect)
                    log.warning("database error (%s): %s; reconnecting in %.2f s", error_code(e), first_line(e),
                                delay, extra={"db_error": e})
                    if listener is not None:
                        listener.close()
                        listener = None
                    self._drop_connection()
                    stop.wait(delay)
        finally:
            if listener is not None:
                listener.close()
