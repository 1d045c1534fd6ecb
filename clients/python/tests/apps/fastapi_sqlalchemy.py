"""A FastAPI app whose business code writes with its own SQLAlchemy ORM session, in the
claim's transaction (pg_idempotency.sqlalchemy.EnginePool). For tests/test_sqlalchemy.py.
X-Fail-After-Write: the handler raises after its row is flushed; X-Delay-Ms: it sleeps first."""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, Field
from sqlalchemy import String, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from pg_idempotency import COMMITTED_FIRST, RoutePolicy
from pg_idempotency.asgi import AsyncIdempotencyContext, IdempotencyMiddleware
from pg_idempotency.fastapi import Idempotent, from_request, idempotent_routes
from pg_idempotency.sqlalchemy import EnginePool

url = os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
# prepare_threshold=None: through PgBouncer in transaction pooling (README, PgBouncer)
engine = create_async_engine(url, pool_size=4, connect_args={"prepare_threshold": None})
db = EnginePool(engine)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sa_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String)
    item: Mapped[str] = mapped_column(String)
    quantity: Mapped[int]


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield
    await db.close()


app = FastAPI(lifespan=lifespan)
app.add_middleware(IdempotencyMiddleware, pool=db, routes=idempotent_routes,
                   tenant=from_request(lambda request: request.headers["x-api-key"]))
ORDERS = Idempotent(RoutePolicy(required=False))


class OrderIn(BaseModel):
    item: str
    quantity: int = Field(gt=0)


@app.get("/healthz")
async def healthz():
    return "ok"


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn, request: Request, idem: Annotated[AsyncIdempotencyContext, Depends(ORDERS)]):
    await asyncio.sleep(int(request.headers.get("x-delay-ms", "0")) / 1000)
    session = db.session(idem.conn)
    row = Order(tenant=request.headers["x-api-key"], item=order.item, quantity=order.quantity)
    session.add(row)
    await session.commit()  # flushes; the middleware commits after storing the answer
    if request.headers.get("x-fail-after-write"):
        raise RuntimeError("failing after the write, as asked")
    same = await db.session(idem.conn).scalar(select(Order.item).where(Order.id == row.id))
    return {"id": row.id, "item": same, "quantity": row.quantity, "key": idem.key}


def add_sync(session: Session, tenant: str, order: OrderIn) -> int:
    """Sync ORM code, as an application already has it."""
    row = Order(tenant=tenant, item=order.item, quantity=order.quantity)
    session.add(row)
    session.flush()
    return row.id


@app.post("/orders/sync", status_code=201)
async def create_order_sync(order: OrderIn, request: Request,
                            idem: Annotated[AsyncIdempotencyContext, Depends(ORDERS)]):
    order_id = await db.session(idem.conn).run_sync(add_sync, request.headers["x-api-key"], order)
    return {"id": order_id, "item": order.item, "quantity": order.quantity, "key": idem.key}


@app.post("/orders/external", status_code=201)
async def create_order_committed_first(order: OrderIn, request: Request,
                                       idem: Annotated[AsyncIdempotencyContext,
                                                       Depends(Idempotent(RoutePolicy(mode=COMMITTED_FIRST)))]):
    async with idem.step("saved") as conn:
        order_id = await db.session(conn).run_sync(add_sync, request.headers["x-api-key"], order)
    return {"id": order_id, "item": order.item, "point": idem.point}
