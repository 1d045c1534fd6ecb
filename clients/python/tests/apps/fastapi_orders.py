"""A FastAPI app of the kind an application writes (a Pydantic body model, Refused raised by a
handler, a route where the key is optional), for tests/test_application.py:
DATABASE_URL=... python -m uvicorn --app-dir tests/apps fastapi_orders:app"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from pg_idempotency import Refused, RoutePolicy
from pg_idempotency.asgi import IdempotencyMiddleware, make_pool

pool = make_pool(os.environ["DATABASE_URL"], min_size=1, max_size=4)


@asynccontextmanager
async def lifespan(app: FastAPI):
    await pool.open(wait=True)
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS orders (tenant text, item text, quantity int)")
        await conn.execute("CREATE TABLE IF NOT EXISTS notes (tenant text, text text)")
    yield
    await pool.close()


app = FastAPI(lifespan=lifespan)
app.add_middleware(IdempotencyMiddleware, pool=pool, routes={
    "POST /orders": RoutePolicy(), "POST /notes": RoutePolicy(required=False), "POST /refusals": RoutePolicy()},
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


@app.post("/notes", status_code=201)
async def create_note(request: Request):
    """required=False: the same handle with or without a key."""
    idem = request.state.idempotency
    text = (await request.json())["text"]
    await idem.conn.execute("INSERT INTO notes VALUES (%s, %s)", (request.headers["x-api-key"], text))
    return {"text": text, "key": idem.key}


@app.post("/refusals")
async def refuse(request: Request):
    await request.state.idempotency.conn.execute(
        "INSERT INTO notes VALUES (%s, 'written before the refusal')", (request.headers["x-api-key"],))
    raise Refused(status=403, title="Forbidden", detail="not your account", headers={"X-Reason": "tenant"})
