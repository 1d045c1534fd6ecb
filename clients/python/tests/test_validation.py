"""A request the framework rejects before the handler runs (FastAPI/Pydantic 422, a JSON
parse error, a 400 of the application's own checks) leaves the key free, by default: the
corrected body with the same key then runs, and the broken body is not answered from the
store. Over real HTTP, against the real extension."""

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


@pytest.fixture(scope="module")
def pydantic_app(db_url, log_dir):
    port = free_port()
    log = open(log_dir / f"fastapi-validation-{port}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(APPS_DIR), "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "fastapi_validation:app"],
        stdout=log, stderr=log, env={**os.environ, "DATABASE_URL": db_url})
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"the app exited; see {log.name}"
        assert time.monotonic() < deadline, f"the app did not answer in 30 s; see {log.name}"
        try:
            if request(port, "GET", "/healthz", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(10)
    log.close()


def post(port: int, body, key: str, tenant: str):
    return request(port, "POST", "/orders", body, [("X-Api-Key", tenant), ("Idempotency-Key", key)])


def orders(db_url: str, tenant: str) -> int:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT count(*) FROM orders WHERE tenant = %s", (tenant,)).fetchone()[0]


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
