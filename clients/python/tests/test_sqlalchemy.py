"""A FastAPI app writing with its own SQLAlchemy ORM session in the claim's transaction
(tests/apps/fastapi_sqlalchemy.py, pg_idempotency.sqlalchemy.EnginePool), over real HTTP
against the real extension, directly and through PgBouncer: one row per key under concurrent
duplicates, the replay byte for byte, a handler exception rolls back the row and the claim,
Pydantic's 422 leaves the key free, sync ORM code through run_sync, no key (required=False);
and README.md's SQLAlchemy example (examples/orders_sqlalchemy.py), as it is."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from conftest import free_port, request, with_database
from test_application import count, post, start_app
from test_readme import EXAMPLES, check_orders_app, fresh_database


@pytest.fixture(scope="module", params=["direct", "pgbouncer"])
def sa_app(request, db_url, log_dir):
    url = db_url
    if request.param == "pgbouncer":
        bouncer = os.environ.get("IDEM_PY_PGBOUNCER_URL")
        if not bouncer:
            pytest.skip("IDEM_PY_PGBOUNCER_URL is not set (clients/python/test.sh starts PgBouncer and sets it)")
        url = with_database(bouncer, "idem_py")
    port, proc, log = start_app("fastapi_sqlalchemy:app", url, log_dir)
    yield port
    proc.terminate()
    proc.wait(10)
    log.close()


def rows(db_url: str, tenant: str) -> int:
    return count(db_url, "sa_orders", tenant)


def keys(db_url: str, key: str) -> int:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT count(*) FROM idempotency.keys WHERE key = %s", (key,)).fetchone()[0]


def test_one_row_per_key_under_concurrent_duplicates_and_a_replay_byte_for_byte(sa_app, db_url):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    body = {"item": "book", "quantity": 2}

    def send(_):
        headers = [("X-Api-Key", tenant), ("Idempotency-Key", key), ("X-Delay-Ms", "300")]
        return request(sa_app, "POST", "/orders", body, headers, timeout=30)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(8)))
    assert all(a.status == 201 for a in answers), [(a.status, a.body) for a in answers]
    assert len({a.body for a in answers}) == 1  # one answer, the others its replays
    assert sum(not a.replayed for a in answers) == 1, [a.replayed for a in answers]
    first = answers[0].json()
    assert first["item"] == "book" and first["quantity"] == 2 and first["key"] == key
    again = post(sa_app, body, key, tenant)
    assert again.status == 201 and again.replayed and again.body == answers[0].body, again
    assert rows(db_url, tenant) == 1


def test_a_handler_exception_rolls_back_the_row_and_the_claim(sa_app, db_url):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    body = {"item": "pen", "quantity": 1}
    failed = request(sa_app, "POST", "/orders", body,
                     [("X-Api-Key", tenant), ("Idempotency-Key", key), ("X-Fail-After-Write", "1")])
    assert failed.is_problem(500) and not failed.replayed, failed
    assert rows(db_url, tenant) == 0 and keys(db_url, key) == 0  # the flushed row and the claim rolled back
    good = post(sa_app, body, key, tenant)
    assert good.status == 201 and not good.replayed, good  # the key was free
    assert rows(db_url, tenant) == 1


@pytest.mark.parametrize("broken", [{"item": "book"}, {"item": "book", "quantity": 0}, b'{"item": "bo'],
                         ids=["missing field", "invalid field", "JSON parse error"])
def test_pydantic_422_leaves_the_key_free(sa_app, db_url, broken):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    first = post(sa_app, broken, key, tenant)
    assert first.status == 422 and not first.replayed, first
    assert keys(db_url, key) == 0
    good = post(sa_app, {"item": "book", "quantity": 3}, key, tenant)
    assert good.status == 201 and not good.replayed and good.json()["quantity"] == 3, good
    assert rows(db_url, tenant) == 1


def test_sync_orm_code_through_run_sync_and_no_key(sa_app, db_url):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    first = post(sa_app, {"item": "cup", "quantity": 1}, key, tenant, "/orders/sync")
    again = post(sa_app, {"item": "cup", "quantity": 1}, key, tenant, "/orders/sync")
    assert first.status == 201 and not first.replayed and again.replayed and again.body == first.body, again
    bare = post(sa_app, {"item": "mug", "quantity": 1}, None, tenant)  # required=False: the same session
    assert bare.status == 201 and bare.json()["key"] is None and bare.json()["item"] == "mug", bare
    assert rows(db_url, tenant) == 2


def test_a_committed_first_step_writes_with_the_session(sa_app, db_url):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    first = post(sa_app, {"item": "lamp", "quantity": 1}, key, tenant, "/orders/external")
    assert first.status == 201 and not first.replayed and first.json()["point"] == "saved", first
    again = post(sa_app, {"item": "lamp", "quantity": 1}, key, tenant, "/orders/external")
    assert again.status == 201 and again.replayed and again.body == first.body, again
    assert rows(db_url, tenant) == 1


def test_readme_sqlalchemy_example(db_url, log_dir):
    url = fresh_database(db_url, "idem_readme_sa")
    port = free_port()
    log = open(log_dir / f"readme-sa-app-{port}.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLES), "--port", str(port),
                             "orders_sqlalchemy:app"], stdout=log, stderr=log,
                            env={**os.environ, "DATABASE_URL": url.replace("postgresql://", "postgresql+psycopg://")})
    check_orders_app(proc, log, port, url)


def test_an_engine_that_cannot_connect_is_the_database_unavailable():
    """What the middleware answers 503 for: EnginePool raises psycopg's own error, not
    SQLAlchemy's wrapper, for a connection refused (a port nothing listens on)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from pg_idempotency.errors import unavailable
    from pg_idempotency.sqlalchemy import EnginePool

    async def connect():
        db = EnginePool(create_async_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres"))
        try:
            async with db.connection():
                pass
        finally:
            await db.close()

    with pytest.raises(psycopg.OperationalError) as raised:
        asyncio.run(connect())
    assert unavailable(raised.value), raised.value


def test_a_sync_engine_is_refused_with_the_way_out():
    from sqlalchemy import create_engine

    from pg_idempotency.sqlalchemy import EnginePool

    with pytest.raises(TypeError, match="create_async_engine"):
        EnginePool(create_engine("postgresql+psycopg://postgres@127.0.0.1/postgres"))
