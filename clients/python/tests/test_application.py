"""A FastAPI app as an application writes one (tests/apps/fastapi_orders.py), over real HTTP
against the real extension: a request FastAPI/Pydantic rejects before the handler runs (422,
a JSON parse error included) leaves the key free, by default (the corrected body with the same
key then runs; the broken body is not answered from the store); Refused raised by a handler;
required=False gives the handler the same database handle with or without a key."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from conftest import free_port, request

APPS_DIR = Path(__file__).resolve().parent / "apps"


def start_app(target: str, db_url: str, log_dir, server: str = "uvicorn"):
    port = free_port()
    log = open(log_dir / f"{target.split(':')[0]}-{port}.log", "ab")
    argv = {"uvicorn": ["uvicorn", "--app-dir", str(APPS_DIR), "--host", "127.0.0.1", "--port", str(port),
                        "--log-level", "warning", target],
            "gunicorn": ["gunicorn", "--chdir", str(APPS_DIR), "-b", f"127.0.0.1:{port}", "--threads", "4", target]}
    proc = subprocess.Popen([sys.executable, "-m", *argv[server]], stdout=log, stderr=log,
                            env={**os.environ, "DATABASE_URL": db_url})
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"the app exited; see {log.name}"
        assert time.monotonic() < deadline, f"the app did not answer in 30 s; see {log.name}"
        try:
            if request(port, "GET", "/healthz", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.1)
    return port, proc, log


@pytest.fixture(scope="module")
def pydantic_app(db_url, log_dir):
    port, proc, log = start_app("fastapi_orders:app", db_url, log_dir)
    yield port
    proc.terminate()
    proc.wait(10)
    log.close()


@pytest.fixture(scope="module")
def drf_app(db_url, log_dir):
    port, proc, log = start_app("django_drf:application", db_url, log_dir, "gunicorn")
    yield port
    proc.terminate()
    proc.wait(10)
    log.close()


@pytest.fixture(scope="module", params=["fastapi", "django-drf"])
def user_app(request, pydantic_app, drf_app):
    """The FastAPI app and the Django REST framework app: the same routes, /notes and /refusals."""
    return pydantic_app if request.param == "fastapi" else drf_app


@pytest.fixture(scope="module")
def depends_app(db_url, log_dir):
    port, proc, log = start_app("fastapi_depends:app", db_url, log_dir)
    yield port
    proc.terminate()
    proc.wait(10)
    log.close()


def post(port: int, body, key: str | None, tenant: str, path: str = "/orders"):
    headers = [("X-Api-Key", tenant)] + ([("Idempotency-Key", key)] if key is not None else [])
    return request(port, "POST", path, body, headers)


def count(db_url: str, table: str, tenant: str) -> int:
    with psycopg.connect(db_url) as c:
        return c.execute(f"SELECT count(*) FROM {table} WHERE tenant = %s", (tenant,)).fetchone()[0]


def orders(db_url: str, tenant: str) -> int:
    return count(db_url, "orders", tenant)


@pytest.mark.parametrize("broken", [{"item": "book"}, {"item": "book", "quantity": 0}, b'{"item": "bo'],
                         ids=["missing field", "invalid field", "JSON parse error"])
def test_pydantic_422_leaves_the_key_free(pydantic_app, db_url, broken):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    first = post(pydantic_app, broken, key, tenant)
    assert first.status == 422 and "detail" in first.json() and not first.replayed, first
    again = post(pydantic_app, broken, key, tenant)
    assert again.status == 422 and not again.replayed, again  # validated again, not replayed
    good = post(pydantic_app, {"item": "book", "quantity": 2}, key, tenant)
    assert good.status == 201 and not good.replayed and good.json() == {"item": "book", "quantity": 2}, good
    replay = post(pydantic_app, {"item": "book", "quantity": 2}, key, tenant)
    assert replay.status == 201 and replay.replayed and replay.body == good.body, replay
    assert orders(db_url, tenant) == 1


def test_refused_from_a_handler_is_its_problem_and_leaves_the_key_free(user_app, db_url):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    for _ in range(2):
        r = post(user_app, {}, key, tenant, "/refusals")
        assert r.status == 403 and r.headers["content-type"] == "application/problem+json" and not r.replayed, r
        assert r.headers["x-reason"] == "tenant"
        assert r.json() == {"type": "about:blank", "title": "Forbidden", "status": 403, "detail": "not your account"}
    assert count(db_url, "notes", tenant) == 0  # the handler's write rolled back with the claim
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM idempotency.keys WHERE key = %s", (key,)).fetchone()[0] == 0


def test_key_optional_the_same_handle_with_or_without_a_key(user_app, db_url):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    bare = post(user_app, {"text": "no key"}, None, tenant, "/notes")
    assert bare.status == 201 and bare.json() == {"text": "no key", "key": None}, bare
    keyed = post(user_app, {"text": "keyed"}, key, tenant, "/notes")
    assert keyed.status == 201 and keyed.json() == {"text": "keyed", "key": key} and not keyed.replayed, keyed
    again = post(user_app, {"text": "keyed"}, key, tenant, "/notes")
    assert again.status == 201 and again.replayed and again.body == keyed.body, again
    assert count(db_url, "notes", tenant) == 2


def test_depends_marks_the_route_and_hands_over_the_context(depends_app, db_url):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    first = post(depends_app, {"name": "a", "note": "x"}, key, tenant, "/items/g1")
    assert first.status == 201 and not first.replayed, first
    assert first.json() == {"group": "g1", "name": "a", "key": key, "scope": f"{tenant}:POST /items/{{group}}"}
    again = post(depends_app, {"name": "a", "note": "other"}, key, tenant, "/items/g1")  # note is ignored
    assert again.status == 201 and again.replayed and again.body == first.body, again
    assert post(depends_app, {"name": "b"}, key, tenant, "/items/g1").is_problem(422)  # another payload
    assert count(db_url, "items", tenant) == 1
    missing = request(depends_app, "POST", "/items/g1", {"name": "a"}, [("X-Api-Key", tenant)])
    assert missing.is_problem(400), missing  # a marked route requires the key


def test_depends_on_a_router_marks_its_routes_and_unmarked_routes_stay_free(depends_app):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    for path in ("/v2/items", "/v3/things"):  # APIRouter(dependencies=...), include_router(dependencies=...)
        first = post(depends_app, {"name": "a"}, key, tenant, path)
        again = post(depends_app, {"name": "a"}, key, tenant, path)
        assert first.status == 201 and not first.replayed and again.replayed and again.body == first.body, again
    plain = request(depends_app, "POST", "/plain", {"name": "a"}, [("X-Api-Key", tenant)])
    assert plain.status == 201 and not plain.replayed, plain


@pytest.mark.parametrize("broken", [{"item": "book"}, {"item": "book", "quantity": 0}, b'{"item": "bo'],
                         ids=["missing field", "invalid field", "JSON parse error"])
def test_drf_400_leaves_the_key_free(drf_app, db_url, broken):
    tenant, key = "t_" + uuid.uuid4().hex[:10], str(uuid.uuid4())
    first = post(drf_app, broken, key, tenant)
    assert first.status == 400 and not first.replayed, first
    again = post(drf_app, broken, key, tenant)
    assert again.status == 400 and not again.replayed, again
    good = post(drf_app, {"item": "book", "quantity": 2}, key, tenant)
    assert good.status == 201 and not good.replayed and good.json() == {"item": "book", "quantity": 2}, good
    replay = post(drf_app, {"item": "book", "quantity": 2}, key, tenant)
    assert replay.status == 201 and replay.replayed and replay.body == good.body, replay
    assert orders(db_url, tenant) == 1
