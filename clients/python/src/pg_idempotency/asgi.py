"""ASGI middleware (Starlette, FastAPI, any ASGI app) on a psycopg AsyncConnectionPool.

    app.add_middleware(IdempotencyMiddleware, pool=pool, tenant=tenant_of,
                       routes={"POST /charges": RoutePolicy(),
                               "POST /charges/external": RoutePolicy(mode=COMMITTED_FIRST)})

Handlers find an `AsyncIdempotencyContext` in `request.state.idempotency`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncContextManager, AsyncIterator, Awaitable, Callable, Mapping, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from . import http
from .client import AsyncIdempotency, Claim
from .context import ClaimContext
from .errors import IdempotencyError, NoLiveRecord, NotOwner, ended_uncommitted, unavailable
from .fingerprint import fingerprint_body
from .health import is_dead, last_words
from .http import COMMITTED_FIRST, Answer, Refused, RoutePolicy
from .routes import RouteTable

log = logging.getLogger("pg_idempotency")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


# How long a request waits for a connection of the pool (any pool's own timeout
# notwithstanding) before the middleware answers 503: the database being down must not hold
# requests for the pool's default (psycopg_pool: 30 s).
CONNECTION_TIMEOUT = 1.0


class Pool(Protocol):
    """What the middleware draws connections from: psycopg_pool's AsyncConnectionPool, or
    pg_idempotency.sqlalchemy.EnginePool. Connections in autocommit."""

    def connection(self, timeout: float | None = None) -> AsyncContextManager[psycopg.AsyncConnection]: ...


def make_pool(conninfo: str, **kwargs: Any) -> AsyncConnectionPool:
    """An AsyncConnectionPool with the middleware's defaults: autocommit connections and
    psycopg's automatic prepared statements off (prepare_threshold=None), so it works
    through PgBouncer in transaction pooling. Open it with `await pool.open()`."""
    conn_kwargs = {"autocommit": True, "prepare_threshold": None, **kwargs.pop("kwargs", {})}
    return AsyncConnectionPool(conninfo, kwargs=conn_kwargs, open=False, **kwargs)


@asynccontextmanager
async def live_connection(pool: Pool, timeout: float = CONNECTION_TIMEOUT, *,
                          deadline: float | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
    """A connection of `pool` that the server has not closed, within `timeout` seconds (or by
    `deadline`, the event loop's clock): one found dead (the database restarted while it sat
    in the pool) goes back, to be discarded, and the next is taken; nothing was sent on it.
    Raises psycopg_pool.PoolTimeout when no live connection came in time (the database is down,
    or the pool exhausted). The middleware takes every connection this way; an application's
    own routes can too."""
    clock = asyncio.get_running_loop().time
    if deadline is None:
        deadline = clock() + timeout
    while True:
        left = deadline - clock()
        if left <= 0:
            raise PoolTimeout(f"no live connection within {timeout:g} s")
        async with pool.connection(timeout=left) as conn:
            if not is_dead(conn):
                yield conn
                return
            log.info("a pooled connection was closed by the server (a restart?): taking another")


def default_tenant(request_scope: Scope) -> str:
    user = request_scope.get("user")
    identity = getattr(user, "identity", None)
    return str(identity) if identity else "anonymous"


class AsyncIdempotencyContext(ClaimContext):
    """What a protected handler gets: the claim, and (same transaction) the open
    connection `conn`, or (committed first) `step()` to run a side effect fenced and recorded."""

    def __init__(self, client: AsyncIdempotency, pool: Pool, scope: str, key: str | None,
                 claim: Claim | None, policy: RoutePolicy, conn: psycopg.AsyncConnection | None,
                 connection_timeout: float = CONNECTION_TIMEOUT):
        super().__init__(scope, key, claim, policy)
        self.client, self.pool, self.conn = client, pool, conn
        self.connection_timeout = connection_timeout
        self._lock = asyncio.Lock()

    def connection(self) -> AsyncContextManager[psycopg.AsyncConnection]:
        return live_connection(self.pool, self.connection_timeout)

    @asynccontextmanager
    async def step(self, recovery_point: str, recovery_data: Any = None) -> AsyncIterator[psycopg.AsyncConnection]:
        """Committed-first mode: a transaction for one side effect. On a clean exit the
        checkpoint (which fails with NotOwner if the claim was taken over, rolling the side
        effect back) and the side effect commit together."""
        async with self._lock, self.connection() as conn, conn.transaction():
            yield conn
            if self.key is not None:  # without a key (required=False) there is no record
                await self.client.checkpoint(conn, self.scope, self.key, self.token,  # type: ignore[arg-type]
                                             recovery_point, recovery_data, self.policy.lease)
        self.point, self.data = recovery_point, recovery_data

    async def renew(self) -> None:
        async with self._lock, self.connection() as conn:
            await self.client.checkpoint(conn, self.scope, self.key, self.token,  # type: ignore[arg-type]
                                         self.renewal_point(), self.data, self.policy.lease)


class IdempotencyMiddleware:
    """`connection_timeout`: how long a request waits for a live connection of `pool`, whatever
    the pool's own timeout, before its 503 (the database down must answer at once, not after
    psycopg_pool's 30 s)."""

    def __init__(self, app: Callable[..., Awaitable[None]], *, pool: Pool,
                 routes: Mapping[str, RoutePolicy] | Callable[[Any], Mapping[str, RoutePolicy]],
                 tenant: Callable[[Scope], str] = default_tenant,
                 scope_function: Callable[[str, str, str], str] = http.default_scope,
                 client: AsyncIdempotency | None = None, connection_timeout: float = CONNECTION_TIMEOUT):
        self.app, self.pool = app, pool
        # routes: the table, or a function reading it from the application (scope["app"]) at
        # its first request, e.g. pg_idempotency.fastapi.idempotent_routes
        self.routes_of = None if isinstance(routes, Mapping) else routes
        self.routes = RouteTable(routes) if isinstance(routes, Mapping) else RouteTable({})
        self.tenant, self.scope_function = tenant, scope_function
        self.client = client or AsyncIdempotency()
        self.connection_timeout = connection_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.routes_of is not None and scope["type"] == "http":
            self.routes, self.routes_of = RouteTable(self.routes_of(scope["app"])), None
        match = self.routes.match(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if match is None:
            return await self.app(scope, receive, send)
        template, policy = match
        try:
            tenant = self.tenant(scope)
            values = [v for n, v in scope["headers"] if n == b"idempotency-key"]
            key = http.parse_key(values) if values or policy.required else None
            idem_scope = self.scope_function(tenant, scope["method"], template)
        except Refused as r:
            return await write(send, r.answer)
        except Exception:
            log.exception("%s %s: the tenant or scope function failed", scope["method"], template)
            return await write(send, http.contract_problem("internal-error"))
        body = await read_body(receive)
        if key is None:
            return await write(send, await self.without_key(scope, body, idem_scope, policy))
        fingerprint = fingerprint_body(body, policy.ignore_fields)
        progress = _Progress()
        answered = False
        try:
            # What must still happen once the answer is written (a writeless claim's ROLLBACK,
            # the connection back to the pool): the client does not wait for it.
            async with AsyncExitStack() as after_answer:
                try:
                    if policy.mode == COMMITTED_FIRST:
                        answer = await self.committed_first(scope, body, idem_scope, key, fingerprint, policy,
                                                            progress)
                    else:
                        answer = await self.same_transaction(after_answer, scope, body, idem_scope, key,
                                                             fingerprint, policy, progress)
                except Exception as e:
                    report = log.warning if unavailable(e) else log.error
                    report("%s / %s failed (%s): %s", idem_scope, key, getattr(e, "sqlstate", None), e)
                    answer = http.failure_answer(e, progress.handler_ran)
                await write(send, answer)
                answered = True
        except Exception as e:  # giving the connection back failed: the answer is out, the pool copes
            if not answered:
                raise
            log.warning("%s / %s: after the answer: %s", idem_scope, key, e)

    def deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.connection_timeout

    def connection(self, deadline: float | None = None) -> AsyncContextManager[psycopg.AsyncConnection]:
        return live_connection(self.pool, self.connection_timeout, deadline=deadline)

    def context(self, idem_scope: str, key: str | None, claim: Claim | None, policy: RoutePolicy,
                conn: psycopg.AsyncConnection | None) -> AsyncIdempotencyContext:
        return AsyncIdempotencyContext(self.client, self.pool, idem_scope, key, claim, policy, conn,
                                       self.connection_timeout)

    async def without_key(self, scope: Scope, body: bytes, idem_scope: str, policy: RoutePolicy) -> Answer:
        """required=False and no key: the handler runs unprotected but with the same handle
        (same transaction: `conn` in a transaction that commits unless the answer is one that
        would not be stored; committed first: `step()` without checkpoints)."""
        progress = _Progress()
        try:
            if policy.mode == COMMITTED_FIRST:
                ctx = self.context(idem_scope, None, None, policy, None)
                progress.handler_ran = True
                return Answer(*await run_app(self.app, scope, body, ctx))
            async with self.connection() as conn, conn.transaction():
                ctx = self.context(idem_scope, None, None, policy, conn)
                progress.handler_ran = True
                answer = Answer(*await run_app(self.app, scope, body, ctx))
                if not policy.stores(answer.status):
                    raise _RolledBack(answer)
                return answer
        except _RolledBack as r:
            return r.answer
        except Exception as e:
            log.error("%s without a key failed: %r", idem_scope, e, exc_info=e)
            return http.failure_answer(e, progress.handler_ran)

    async def claim(self, conn: psycopg.AsyncConnection, idem_scope: str, key: str, fingerprint: str,
                    policy: RoutePolicy, token: uuid.UUID | None = None, *, begin: bool = False) -> Claim:
        """The claim; with `begin`, `BEGIN` is sent with it (one round trip) and the
        transaction is left open."""
        features = await self.client.features(conn)
        claim = self.client.begin_and_claim if begin else self.client.claim
        return await claim(conn, idem_scope, key, fingerprint, ttl=policy.ttl, lease=policy.lease,
                           wait=policy.wait if features.claim_wait else None,
                           token=(token or uuid.uuid4()) if features.claim_token else None)

    async def claim_committed(self, idem_scope: str, key: str, fingerprint: str, policy: RoutePolicy) -> Claim:
        """A committed claim. With an extension that takes the caller's token, a claim whose
        connection broke (maybe during its commit) is repeated once with the same token: it
        answers `claimed` again if the first one did commit."""
        token = uuid.uuid4()
        deadline = self.deadline()
        async with self.connection(deadline) as conn:
            try:
                return await self.claim(conn, idem_scope, key, fingerprint, policy, token)
            except psycopg.OperationalError as e:
                if not (self.client.known_features and self.client.known_features.claim_token):
                    raise
                log.warning("the claim of %s / %s lost its connection (%s); repeating it with its token",
                            idem_scope, key, e)
        async with self.connection(deadline) as conn:
            return await self.claim(conn, idem_scope, key, fingerprint, policy, token)

    async def claim_in_transaction(self, after_answer: AsyncExitStack, idem_scope: str, key: str,
                                   fingerprint: str, policy: RoutePolicy) -> tuple[psycopg.AsyncConnection, Claim]:
        """A live connection with `BEGIN` and the claim sent on it, the transaction left open
        (the connection goes back to the pool with `after_answer`). A claim whose connection was
        lost on the way is sent once more on another: its transaction did not commit."""
        deadline = self.deadline()
        for last in (False, True):
            attempt = AsyncExitStack()
            conn = await attempt.enter_async_context(self.connection(deadline))
            try:
                claim = await self.claim(conn, idem_scope, key, fingerprint, policy, begin=True)
            except BaseException as e:
                await roll_back(conn)
                await attempt.aclose()
                if last or not (isinstance(e, Exception) and unavailable(e)):
                    raise
                log.warning("the claim of %s / %s lost its connection (%s); sending it again on another",
                            idem_scope, key, e)
                continue
            await after_answer.enter_async_context(attempt)
            return conn, claim
        raise AssertionError("unreachable")

    async def same_transaction(self, after_answer: AsyncExitStack, scope: Scope, body: bytes, idem_scope: str,
                               key: str, fingerprint: str, policy: RoutePolicy, progress: _Progress) -> Answer:
        """`BEGIN` + claim, the handler, idem_complete + `COMMIT`: two round trips besides the
        handler's. A claim that runs nothing (replay, 409, 422, 410) is answered at once and
        rolled back after the answer is written. Answers that are not stored roll back
        first. The database gone before the COMMIT was sent (or the server ending the session
        before committing) is a 503: nothing was committed. Other errors roll back and raise to
        __call__."""
        conn, claim = await self.claim_in_transaction(after_answer, idem_scope, key, fingerprint, policy)
        try:
            if not claim.owned:
                after_answer.push_async_callback(roll_back, conn)
                return http.answer_without_work(claim)
            ctx = self.context(idem_scope, key, claim, policy, conn)
            progress.handler_ran = True
            with last_words(conn) as ended:
                try:
                    status, headers, out = await run_app(self.app, scope, body, ctx)
                except Exception as e:
                    await roll_back(conn)
                    if unavailable(e):
                        log.warning("%s / %s: the database went away while the handler ran (%s); nothing was "
                                    "committed", idem_scope, key, e)
                        return http.contract_problem("service-unavailable")
                    log.exception("handler failed; the claim and its writes are rolled back")
                    return http.contract_problem("internal-error")
                if not policy.stores(status):
                    await roll_back(conn)
                    return Answer(status, headers, out)
                if ended or is_dead(conn):
                    log.warning("%s / %s: the server closed the connection while the handler ran; nothing was "
                                "committed", idem_scope, key)
                    return http.contract_problem("service-unavailable")
                text, stored = http.storable(policy, headers, out)
                try:
                    sent = await self.client.complete_and_commit(conn, idem_scope, key, claim.token,  # type: ignore[arg-type]
                                                                 status, stored, text)
                except Exception as e:
                    if not (ended or ended_uncommitted(e)):
                        raise
                    log.warning("%s / %s: the server ended the session before the COMMIT (%s); nothing was "
                                "committed", idem_scope, key, e)
                    return http.contract_problem("service-unavailable")
            return first_answer(status, headers, stored, sent)
        except BaseException:
            await roll_back(conn)
            raise

    async def committed_first(self, scope: Scope, body: bytes, idem_scope: str, key: str, fingerprint: str,
                              policy: RoutePolicy, progress: _Progress) -> Answer:
        try:
            claim = await self.claim_committed(idem_scope, key, fingerprint, policy)
        except (IdempotencyError, psycopg.Error) as e:
            log.error("the claim of %s / %s failed (%s): %s", idem_scope, key, getattr(e, "sqlstate", None), e)
            return http.contract_problem("service-unavailable")
        if not claim.owned:
            return http.answer_without_work(claim)
        ctx = self.context(idem_scope, key, claim, policy, None)
        progress.handler_ran = True
        renewer = asyncio.create_task(keep_lease(ctx))
        error: Exception | None = None
        try:
            status, headers, out = await run_app(self.app, scope, body, ctx)
        except NotOwner:
            log.warning("%s / %s was taken over while its handler ran: its step was refused", idem_scope, key)
            return http.fenced_answer()
        except Exception as e:
            if unavailable(e):
                log.warning("%s / %s: the database went away while the handler ran: %s", idem_scope, key, e)
            else:
                log.exception("handler failed")
            status, headers, out = 500, [], b""
            error = e
        finally:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        if not policy.stores(status):
            if ctx.point is None:
                await self.release(idem_scope, key, claim)
            if error is None:
                return Answer(status, headers, out)
            # Nothing done (no step) because the database went away: the same request can run later.
            gone = ctx.point is None and unavailable(error)
            return http.contract_problem("service-unavailable" if gone else "internal-error")
        if error is not None:
            problem = http.contract_problem("internal-error")
            status, headers, out = problem.status, problem.headers, problem.body
        text, stored = http.storable(policy, headers, out)
        try:
            async with self.connection() as conn:
                sent = await self.client.complete(conn, idem_scope, key, claim.token, status,  # type: ignore[arg-type]
                                                  headers=stored, body_json=text)
        except (NotOwner, NoLiveRecord) as e:
            log.warning("late completion refused for %s / %s (%s): the claim was taken over", idem_scope, key,
                        e.sqlstate)
            return http.fenced_answer()
        return first_answer(status, headers, stored, sent)

    async def release(self, idem_scope: str, key: str, claim: Claim) -> None:
        """Gives the key back; with the database away it stays claimed until its lease ends."""
        try:
            async with self.connection() as conn:
                await self.client.release(conn, idem_scope, key, claim.token)  # type: ignore[arg-type]
        except Exception as e:
            if not unavailable(e):
                raise
            log.warning("%s / %s could not be released (%s): it is free again when its lease ends",
                        idem_scope, key, e)


class _RolledBack(Exception):
    def __init__(self, answer: Answer):
        self.answer = answer


async def roll_back(conn: psycopg.AsyncConnection) -> None:
    """Ends the transaction left open, if any; a connection that fails here is discarded by
    the pool, which rolls back what it is given back in a transaction."""
    if conn.closed:  # the server's side is gone, and its transaction with it
        return
    try:
        await conn.rollback()
    except psycopg.Error as e:
        log.warning("ROLLBACK failed: %s", e)


class _Progress:
    """How far one request got: whether its handler was started (after which an error is a
    500, never a 503 "nothing was done")."""

    handler_ran = False


def first_answer(status: int, headers: list[tuple[str, str]], stored: dict[str, str], sent: str | None) -> Answer:
    """The handler's answer with the body as a replay will send it (jsonb's text form)."""
    body = http.stored_answer(status, stored, sent).body
    return Answer(status, [(n, v) for n, v in headers if n.lower() != "content-length"], body)


async def keep_lease(ctx: AsyncIdempotencyContext) -> None:
    period = (ctx.policy.lease.total_seconds() if ctx.policy.lease else 300) / 3
    while True:
        await asyncio.sleep(period)
        try:
            await ctx.renew()
        except NotOwner:
            ctx.lost = True
            log.warning("lease of %s / %s lost: taken over", ctx.scope, ctx.key)
            return
        except Exception as e:  # the next renewal may work; the lease still runs meanwhile
            log.warning("lease renewal of %s / %s failed: %s", ctx.scope, ctx.key, e)


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def run_app(app: Callable[..., Awaitable[None]], scope: Scope, body: bytes,
                  ctx: AsyncIdempotencyContext) -> tuple[int, list[tuple[str, str]], bytes]:
    """Runs the app with the already-read body and the context in scope["state"]; returns
    its whole answer."""
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # like a client that stays connected
        return {"type": "http.disconnect"}

    status, headers, chunks = 500, [], []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    app_scope = dict(scope)
    app_scope["state"] = {**scope.get("state", {}), "idempotency": ctx}
    try:
        await app(app_scope, receive, send)
    except Refused as r:  # the handler's own problem answer
        return r.answer.status, r.answer.headers, r.answer.body
    return status, headers, b"".join(chunks)


async def database_error_handler(request: Any, error: Exception) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A Starlette / FastAPI exception handler for the routes the middleware does not protect:
    `app.add_exception_handler(psycopg.OperationalError, database_error_handler)` answers 503
    problem+json with Retry-After when the database could not be reached (else 500
    problem+json), instead of a plain-text 500."""
    answer = http.failure_answer(error, handler_ran=False)
    log.error("%s: %s", "database unavailable" if answer.status == 503 else "database error", error)

    async def respond(scope: Scope, receive: Receive, send: Send) -> None:
        await write(send, answer)

    return respond


async def write(send: Send, answer: Answer) -> None:
    headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in answer.headers
               if n.lower() != "content-length"]
    headers.append((b"content-length", str(len(answer.body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
