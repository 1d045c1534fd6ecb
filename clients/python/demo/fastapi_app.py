"""The FastAPI demo app: clients/python/demo/run-asgi --database-url URL --listen HOST:PORT"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from contextlib import asynccontextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, PlainTextResponse, Response  # noqa: E402

import common  # noqa: E402
from pg_idempotency import Refused  # noqa: E402
import psycopg  # noqa: E402
from pg_idempotency.asgi import IdempotencyMiddleware, database_error_handler, live_connection, make_pool  # noqa: E402


def problem_response(r: Refused) -> Response:
    a = r.answer
    return Response(a.body, status_code=a.status, headers=dict(a.headers))


def created(charge_id: str, amount: int, currency: str) -> Response:
    return JSONResponse(common.charge_json(charge_id, amount, currency), status_code=201,
                        headers={"Location": f"/charges/{charge_id}"})


def build(args) -> FastAPI:
    # timeout: psycopg_pool's own wait for a connection; the middleware (and live_connection
    # below) wait 1 s at most, so that the database down is a 503 at once
    pool = make_pool(args.database_url, min_size=2, max_size=20, timeout=5)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await pool.open(wait=True)
        async with pool.connection() as conn:
            await conn.execute(common.SCHEMA)
        yield
        await pool.close()

    app = FastAPI(lifespan=lifespan)
    app.add_exception_handler(psycopg.OperationalError, database_error_handler)  # unprotected routes
    app.add_middleware(IdempotencyMiddleware, pool=pool, routes=common.policies(args.lease_ms),
                       tenant=lambda scope: common.tenant_from(header(scope, b"x-api-key")))

    async def inject_faults(request: Request) -> None:
        """X-Fault-Delay-Ms / X-Fault-Fail-Before, with --allow-fault-injection only."""
        delay = common.fault_delay_ms(request.headers, args.allow_fault_injection)
        if delay:
            await asyncio.sleep(delay / 1000)
        if common.fault_fail_before(request.headers, args.allow_fault_injection):
            raise RuntimeError("fault injected before the side effect")

    @app.exception_handler(Refused)
    async def refused(request: Request, r: Refused):
        """A refused request (bad body, unknown charge): its problem answer, which the
        middleware does not store (the key is given back)."""
        return problem_response(r)

    @app.get("/healthz")
    async def healthz():
        return PlainTextResponse("ok\n")

    @app.post("/charges")
    async def create_charge(request: Request):
        """Same transaction: the charge row goes into the claim's transaction."""
        amount, currency = common.parse_charge(await request.body())
        idem = request.state.idempotency
        await inject_faults(request)
        charge_id = common.new_charge_id()
        await idem.conn.execute(common.INSERT_CHARGE, (charge_id, request.headers["x-api-key"], amount, currency))
        return created(charge_id, amount, currency)

    @app.post("/charges/external")
    async def create_external_charge(request: Request):
        """Committed first: the claim is committed; the charge row is written later in a
        step of its own, fenced by its checkpoint."""
        amount, currency = common.parse_charge(await request.body())
        idem = request.state.idempotency
        await inject_faults(request)
        if idem.point == "charged":  # a takeover after the charge was written: finish it
            charge_id = idem.data["id"]
        else:
            charge_id = common.new_charge_id()
            async with idem.step("charged", {"id": charge_id}) as conn:
                await conn.execute(common.INSERT_CHARGE, (charge_id, request.headers["x-api-key"], amount, currency))
        return created(charge_id, amount, currency)

    @app.get("/charges/{charge_id}")
    async def get_charge(charge_id: str, request: Request):
        tenant = common.tenant_from(request.headers.get("x-api-key"))
        async with live_connection(pool) as conn:
            row = await (await conn.execute(common.SELECT_CHARGE, (charge_id, tenant))).fetchone()
        if row is None:
            raise Refused(status=404, detail="no such charge")
        return JSONResponse(common.charge_json(*row))

    return app


def header(scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for n, v in scope["headers"] if n == name), None)


def main() -> None:
    args = common.parse_args("run-asgi")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    common.log(f"demo (FastAPI) listening on {args.host}:{args.port}")
    uvicorn.run(build(args), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
