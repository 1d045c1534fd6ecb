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

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import psycopg
from psycopg_pool import PoolTimeout
from sqlalchemy import exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker


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
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        sa_conn = await _connect(self.engine)
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
                    await session.close()  # rollback_only: leaves the connection's transaction alone
        finally:
            # The middleware's transaction is over by now: SQLAlchemy's rollback is a no-op on
            # an idle autocommit connection, and the pool gets it back as it was lent.
            await sa_conn.close()

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


async def _connect(engine: AsyncEngine) -> AsyncConnection:
    """engine.connect(), with the errors the middleware answers 503 for as psycopg's own
    (SQLAlchemy wraps them)."""
    try:
        return await engine.connect()
    except exc.TimeoutError as e:
        raise PoolTimeout(str(e)) from e
    except exc.DBAPIError as e:
        if isinstance(e.orig, psycopg.Error):
            raise e.orig from e
        raise
