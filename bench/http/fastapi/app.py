"""bench/http.sh's FastAPI app: POST /charges inserts one row and answers 201 with it.

    MIDDLEWARE=on|off DATABASE_URL=... POOL_SIZE=N uvicorn --app-dir bench/http/fastapi app:app

With MIDDLEWARE=on the route is protected by pg_idempotency's IdempotencyMiddleware (same
transaction: the row and the stored answer commit together); off, the same handler inserts on a
connection of the same pool. Nothing else differs."""

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pg_idempotency import RoutePolicy
from pg_idempotency.asgi import IdempotencyMiddleware, make_pool

PROTECTED = {"on": True, "off": False}[os.environ["MIDDLEWARE"]]
POOL_SIZE = int(os.environ.get("POOL_SIZE", "16"))
INSERT = "INSERT INTO charges (amount, currency) VALUES (%s, %s) RETURNING id"

pool = make_pool(os.environ["DATABASE_URL"], min_size=POOL_SIZE, max_size=POOL_SIZE)


@asynccontextmanager
async def lifespan(app):
    await pool.open(wait=True)
    yield
    await pool.close()


app = FastAPI(lifespan=lifespan)
if PROTECTED:
    app.add_middleware(IdempotencyMiddleware, pool=pool, routes={"POST /charges": RoutePolicy()})


async def insert(conn, amount: int, currency: str) -> int:
    cur = await conn.execute(INSERT, (amount, currency))
    return (await cur.fetchone())[0]


@app.post("/charges")
async def create_charge(request: Request):
    body = await request.json()
    amount, currency = body["amount"], body["currency"]
    if PROTECTED:
        charge_id = await insert(request.state.idempotency.conn, amount, currency)
    else:
        async with pool.connection() as conn:
            charge_id = await insert(conn, amount, currency)
    return JSONResponse({"id": charge_id, "amount": amount, "currency": currency}, status_code=201)
