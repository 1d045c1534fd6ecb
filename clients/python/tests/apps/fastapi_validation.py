"""A FastAPI app of the kind an application writes (a Pydantic body model), for the tests of
what FastAPI's own validation answers do to a key:
DATABASE_URL=... python -m uvicorn --app-dir tests/apps fastapi_validation:app"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from pg_idempotency import RoutePolicy
from pg_idempotency.asgi import IdempotencyMiddleware, make_pool

pool = make_pool(os.environ["DATABASE_URL"], min_size=1, max_size=4)


@asynccontextmanager
async def lifespan(app: FastAPI):
    await pool.open(wait=True)
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS orders (tenant text, item text, quantity int)")
    yield
    await pool.close()


app = FastAPI(lifespan=lifespan)
app.add_middleware(IdempotencyMiddleware, pool=pool, routes={"POST /orders": RoutePolicy()},
                   tenant=lambda scope: dict(scope["headers"]).get(b"x-api-key", b"anonymous").decode())


class Order(BaseModel):
    item: str
    quantity: int = Field(gt=0)


@app.get("/healthz")
async def healthz():
    return JSONResponse("ok")


@app.post("/orders", status_code=201)
async def create_order(order: Order, request: Request):
    await request.state.idempotency.conn.execute(
        "INSERT INTO orders VALUES (%s, %s, %s)", (request.headers["x-api-key"], order.item, order.quantity))
    return {"item": order.item, "quantity": order.quantity}
