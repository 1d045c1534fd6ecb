"""The README's SQLAlchemy example: POST /orders made idempotent with FastAPI, the row written
with the application's own SQLAlchemy session, in the claim's transaction.

    pip install "pg-idempotency[fastapi,sqlalchemy]" uvicorn    # until it is on PyPI: README.md, Install
    DATABASE_URL=postgresql+psycopg://app@localhost/app uvicorn orders_sqlalchemy:app

The database needs `CREATE EXTENSION idempotency`; the app creates its table.
"""

import os
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from pg_idempotency import Refused
from pg_idempotency.asgi import AsyncIdempotencyContext, IdempotencyMiddleware
from pg_idempotency.fastapi import Idempotent, from_request, idempotent_routes
from pg_idempotency.sqlalchemy import EnginePool

# postgresql+psycopg:// (psycopg 3). EnginePool lends the middleware the engine's connections in
# autocommit (it sends BEGIN with its claim); prepare_threshold=None turns psycopg's automatic
# prepared statements off, which PgBouncer in transaction mode needs (harmless without it).
engine = create_async_engine(os.environ["DATABASE_URL"], connect_args={"prepare_threshold": None})
db = EnginePool(engine)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str]
    item: Mapped[str]
    quantity: Mapped[int]


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield
    await engine.dispose()


def tenant_of(request: Request) -> str:
    """Whose keys these are (one caller's key never answers another's): the API key here."""
    api_key = request.headers.get("x-api-key")
    if not api_key:
        raise Refused(status=401, detail="send your API key in X-Api-Key", headers={"WWW-Authenticate": "ApiKey"})
    return api_key


app = FastAPI(lifespan=lifespan)
app.add_middleware(IdempotencyMiddleware, pool=db, routes=idempotent_routes, tenant=from_request(tenant_of))
ORDERS = Idempotent()  # marks a route: the middleware protects it, the handler gets its context


class OrderIn(BaseModel):
    item: str
    quantity: int = Field(gt=0)


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn, request: Request,
                       idem: Annotated[AsyncIdempotencyContext, Depends(ORDERS)]):
    session = db.session(idem.conn)  # an AsyncSession in the claim's transaction
    session.add(row := Order(tenant=tenant_of(request), item=order.item, quantity=order.quantity))
    await session.commit()  # flushes; the middleware commits once the answer is stored
    return {"id": row.id, "item": row.item, "quantity": row.quantity}
