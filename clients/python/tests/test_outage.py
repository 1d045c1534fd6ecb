"""The database unavailable under each demo app: test.sh's second cluster (IDEM_PY_OUTAGE_DIR)
stopped while the app runs, then started again. While it is down every answer is 503
application/problem+json (the contract's service-unavailable) with Retry-After, never a
framework's error page; once it is back nothing was lost: a key refused meanwhile runs once,
an earlier key replays."""

from __future__ import annotations

import json
import os
import time
import uuid

import psycopg
import pytest

from conftest import APPS, OUTAGE_DIR, Server, outage_pg_ctl as pg_ctl, with_database

AMOUNT = {"amount": 700, "currency": "eur"}


@pytest.fixture(scope="module")
def outage_db():
    if not OUTAGE_DIR:
        pytest.skip("IDEM_PY_OUTAGE_DIR is not set: clients/python/test.sh starts the cluster this test stops")
    url = os.environ["IDEM_PY_OUTAGE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS idem_outage WITH (FORCE)")
        conn.execute("CREATE DATABASE idem_outage")
    base, _, query = url.partition("?")
    db_url = with_database(base, "idem_outage") + "?" + query
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION idempotency")
    return db_url


def is_unavailable(reply) -> bool:
    if reply.status != 503 or not reply.headers.get("content-type", "").startswith("application/problem+json"):
        return False
    body = json.loads(reply.body)
    retry_after = reply.headers.get("retry-after", "")
    return (body.get("type") == "urn:pg-idempotency:problem:service-unavailable" and body.get("status") == 503
            and retry_after.isdigit() and int(retry_after) >= 1)


def until_served(call, seconds: float = 60):
    """Repeats a request while it answers 503 (as a client honouring Retry-After does)."""
    deadline = time.monotonic() + seconds
    while True:
        reply = call()
        if reply.status != 503 or time.monotonic() > deadline:
            return reply
        assert is_unavailable(reply), reply
        time.sleep(int(reply.headers["retry-after"]))


@pytest.mark.parametrize("kind", sorted(APPS))
def test_database_down_503_then_back_nothing_lost(kind, outage_db, log_dir):
    tenant = "acct_" + uuid.uuid4().hex[:10]
    server = Server(kind, outage_db, log_dir).start()
    try:
        earlier_key = f'"{uuid.uuid4()}"'
        before = server.post("/charges", AMOUNT, earlier_key, tenant)
        assert before.status == 201, before
        pg_ctl("-m", "fast", "stop")
        try:
            keys = {route: f'"{uuid.uuid4()}"' for route in ("/charges", "/charges/external")}
            for route, key in keys.items():
                down = server.post(route, AMOUNT, key, tenant)
                assert is_unavailable(down), (route, down)
            charge_id = before.json()["id"]
            down = server.get(f"/charges/{charge_id}", tenant)  # a route the middleware does not protect
            assert is_unavailable(down), down
        finally:
            pg_ctl("-l", os.path.join(OUTAGE_DIR, "server.log"), "start")
        for route, key in keys.items():
            first = until_served(lambda route=route, key=key: server.post(route, AMOUNT, key, tenant))
            assert first.status == 201 and not first.replayed, (route, first)
            again = server.post(route, AMOUNT, key, tenant)
            assert again.status == 201 and again.replayed and again.body == first.body, (route, again)
        earlier = server.post("/charges", AMOUNT, earlier_key, tenant)
        assert earlier.status == 201 and earlier.replayed and earlier.body == before.body, earlier
        with psycopg.connect(outage_db) as c:
            assert c.execute("SELECT count(*) FROM charges WHERE tenant = %s", (tenant,)).fetchone()[0] == 3
        assert server.get(f"/charges/{charge_id}", tenant).status == 200
    finally:
        server.stop()
