"""The README's example app: POST /orders made idempotent with FastAPI and a psycopg pool.

    pip install "pg-idempotency[fastapi]" uvicorn    # until it is on PyPI: README.md, Install
    DATABASE_URL=postgresql://app@localhost/app uvicorn orders:app

The database needs `CREATE EXTENSION idempotency`; the app creates its table.
"""

import os
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, Field

from pg_idempotency import Refused
from pg_idempotency.asgi import AsyncIdempotencyContext, IdempotencyMiddleware, make_pool
from pg_idempotency.fastapi import Idempotent, from_request, idempotent_routes

# The middleware needs autocommit connections (it sends BEGIN with its claim), and psycopg's
# automatic prepared statements off when PgBouncer (transaction mode) is in front:
# make_pool sets both. A pool of your own: AsyncConnectionPool(url, open=False,
# kwargs={"autocommit": True, "prepare_threshold": None}).
pool = make_pool(os.environ["DATABASE_URL"], max_size=10)


@asynccontextmanager
async def lifespan(app: FastAPI):
    await pool.open()
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, tenant text NOT NULL, "
                           "item text NOT NULL, quantity int NOT NULL)")
    yield
    await pool.close()


def tenant_of(request: Request) -> str:
    """Whose keys these are (one caller's key never answers another's): the API key here."""
    api_key = request.headers.get("x-api-key")
    if not api_key:
        raise Refused(status=401, detail="send your API key in X-Api-Key", headers={"WWW-Authenticate": "ApiKey"})
    return api_key


app = FastAPI(lifespan=lifespan)
app.add_middleware(IdempotencyMiddleware, pool=pool, routes=idempotent_routes, tenant=from_request(tenant_of))
ORDERS = Idempotent()  # marks a route: the middleware protects it, the handler gets its context


class OrderIn(BaseModel):
    item: str
    quantity: int = Field(gt=0)


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn, request: Request,
                       idem: Annotated[AsyncIdempotencyContext, Depends(ORDERS)]):
    # The key is claimed; idem.conn holds the claim's transaction: the row and the stored answer
    # commit together, after the answer is stored.
    cur = await idem.conn.execute("INSERT INTO orders (tenant, item, quantity) VALUES (%s, %s, %s) RETURNING id",
                                  (tenant_of(request), order.item, order.quantity))
    (order_id,) = await cur.fetchone()
    return {"id": order_id, "item": order.item, "quantity": order.quantity}
