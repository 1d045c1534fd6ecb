"""SQLAlchemy (2.x, psycopg 3: `postgresql+psycopg://`) sessions in the claim's own
transaction, for the ASGI middleware (Starlette, FastAPI):

    engine = create_async_engine("postgresql+psycopg://app@db/app")
    db = EnginePool(engine)                  # the middleware's pool: connections from the engine
    app.add_middleware(IdempotencyMiddleware, pool=db, routes=idempotent_routes)

    @app.post("/orders", status_code=201)
    async def create_order(order: OrderIn, idem: Annotated[AsyncIdempotencyContext, Depends(ORDERS)]):
        session = db.session(idem.conn)      # an AsyncSession in the claim's transaction
        session.add(row := Order(item=order.item))
        await session.flush()

Each connection the middleware takes is a checkout of the engine's pool, switched to
autocommit (as make_pool's are) so that the middleware's `conn.transaction()` is the one
transaction: the claim, the session's writes and the stored answer commit together, after the
answer is stored. The session joins that transaction in SQLAlchemy's "rollback_only" mode:
`session.commit()` only flushes (the middleware commits), and a handler that raises rolls back
everything, the claim included, so the key is free again. Sync ORM code runs on the same
session through `await session.run_sync(fn)` (fn gets a sync Session).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, TypeVar

import psycopg
from psycopg_pool import PoolTimeout
from sqlalchemy import exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

log = logging.getLogger("pg_idempotency")
T = TypeVar("T")


class EnginePool:
    """What IdempotencyMiddleware(pool=...) takes, drawing on an AsyncEngine's pool; `session(conn)`
    gives the handler an AsyncSession on the connection it was handed (`idem.conn`, or the
    connection of a committed-first `idem.step()`), made by `sessions` (default:
    `async_sessionmaker(expire_on_commit=False)`)."""

    def __init__(self, engine: AsyncEngine, sessions: async_sessionmaker[Any] | None = None):
        if not isinstance(engine, AsyncEngine):
            raise TypeError("EnginePool needs an AsyncEngine (sqlalchemy.ext.asyncio.create_async_engine): the "
                            "middleware's connections are psycopg's async ones; sync ORM code runs through "
                            "session.run_sync(fn)")
        if engine.dialect.driver != "psycopg":
            raise ValueError(f"EnginePool needs a postgresql+psycopg:// engine (psycopg 3), "
                             f"not {engine.url.drivername}")
        self.engine = engine
        self.sessions = sessions or async_sessionmaker(expire_on_commit=False)
        self._held: dict[int, tuple[AsyncConnection, list[AsyncSession]]] = {}

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
        """A checkout of the engine's pool, within `timeout` seconds (the middleware's bound;
        None: the engine's own pool_timeout). Given back as it was lent, or, when the server
        closed it meanwhile, invalidated (the engine's pool reconnects it at its next
        checkout); nothing raised on the way back (the middleware has answered by then)."""
        sa_conn = await _connect(self.engine, timeout)
        raw: psycopg.AsyncConnection | None = None
        try:
            await sa_conn.execution_options(isolation_level="AUTOCOMMIT")
            await sa_conn.begin()  # SQLAlchemy's side only: the sessions join it; no SQL is sent
            raw = (await sa_conn.get_raw_connection()).driver_connection
            held: list[AsyncSession] = []
            self._held[id(raw)] = (sa_conn, held)
            try:
                yield raw
            finally:
                del self._held[id(raw)]
                for session in held:
                    await _quietly(session.close())  # rollback_only: leaves the connection's transaction alone
        finally:
            if raw is None or raw.closed:
                await _quietly(sa_conn.invalidate())
            # The middleware's transaction is over by now: SQLAlchemy's rollback is a no-op on
            # an idle autocommit connection, and the pool gets it back as it was lent.
            await _quietly(sa_conn.close())

    def session(self, conn: psycopg.AsyncConnection) -> AsyncSession:
        """The AsyncSession of `conn` (one per connection and request: the same object on
        every call), in the transaction the middleware holds on it."""
        found = self._held.get(id(conn))
        if found is None:
            raise RuntimeError("EnginePool.session(): not a connection this EnginePool lent, or its transaction "
                               "is over (pass idem.conn, or the connection of idem.step())")
        sa_conn, held = found
        if not held:
            held.append(self.sessions(bind=sa_conn, join_transaction_mode="rollback_only"))
        return held[0]

    async def open(self, wait: bool = False) -> None:
        """For symmetry with psycopg_pool: the engine's pool opens on its first checkout."""

    async def close(self) -> None:
        await self.engine.dispose()


async def _connect(engine: AsyncEngine, timeout: float | None) -> AsyncConnection:
    """engine.connect() within `timeout` seconds, with the errors the middleware answers 503 for
    as psycopg's own (SQLAlchemy wraps them)."""
    try:
        return await _within(timeout, engine.connect())
    except (exc.TimeoutError, asyncio.TimeoutError) as e:
        raise PoolTimeout(str(e) or f"no connection from the engine within {timeout:g} s") from e
    except exc.DBAPIError as e:
        if isinstance(e.orig, psycopg.Error):
            raise e.orig from e
        raise


if sys.version_info >= (3, 11):
    async def _within(seconds: float | None, awaitable: Awaitable[T]) -> T:
        async with asyncio.timeout(seconds):  # no task of its own, unlike wait_for before 3.12
            return await awaitable
else:  # pragma: no cover - Python 3.10
    _within = asyncio.wait_for


async def _quietly(awaitable: Awaitable[Any]) -> None:
    """Giving a connection back: a failure is logged (the pool discards what it cannot reset)."""
    try:
        await awaitable
    except Exception as e:
        log.warning("giving a connection back to the engine's pool: %s", e)
