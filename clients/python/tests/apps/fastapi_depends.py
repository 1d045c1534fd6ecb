"""A FastAPI app whose routes are marked where they are declared (pg_idempotency.fastapi):
the Idempotent() dependency hands the handler its context, the tenant comes from a Request,
and the middleware is told no route strings. For tests/test_application.py."""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI
from pydantic import BaseModel

from pg_idempotency import RoutePolicy
from pg_idempotency.asgi import AsyncIdempotencyContext, IdempotencyMiddleware, make_pool
from pg_idempotency.fastapi import Idempotent, from_request, idempotent_routes

pool = make_pool(os.environ["DATABASE_URL"], min_size=1, max_size=4)


@asynccontextmanager
async def lifespan(app: FastAPI):
    await pool.open(wait=True)
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS items (tenant text, name text)")
    yield
    await pool.close()


app = FastAPI(lifespan=lifespan)
app.add_middleware(IdempotencyMiddleware, pool=pool, routes=idempotent_routes,
                   tenant=from_request(lambda request: request.headers["x-api-key"]))


class Item(BaseModel):
    name: str


ITEMS = Idempotent(RoutePolicy(ignore_fields=("note",)))


@app.get("/healthz")
async def healthz():
    return "ok"


@app.post("/items/{group}", status_code=201)
async def create_item(group: str, item: Item, idem: Annotated[AsyncIdempotencyContext, Depends(ITEMS)]):
    await idem.conn.execute("INSERT INTO items VALUES (%s, %s)", (idem.scope.split(":")[0], item.name))
    return {"group": group, "name": item.name, "key": idem.key, "scope": idem.scope}


@app.post("/plain", status_code=201)
async def plain(item: Item):
    return {"name": item.name}


router = APIRouter(prefix="/v2", dependencies=[Depends(Idempotent())])


@router.post("/items", status_code=201)
async def create_item_v2(item: Item):
    return {"name": item.name}


app.include_router(router)

things = APIRouter()


@things.post("/things", status_code=201)
async def create_thing(item: Item):
    return {"name": item.name}


app.include_router(things, prefix="/v3", dependencies=[Depends(Idempotent())])
