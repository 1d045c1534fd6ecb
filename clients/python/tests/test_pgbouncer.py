"""The package's defaults through Debian's PgBouncer (1.18) in transaction pooling, where
protocol-level prepared statements do not survive between transactions.

psycopg prepares a query on the server after it ran `prepare_threshold` (default 5) times on a
connection; through PgBouncer the next transaction may land on another server connection,
which lacks it. `pg_idempotency.asgi.make_pool` therefore sets prepare_threshold=None, and
Django's psycopg backend binds on the client side (no prepared statements) by default."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from conftest import Server, with_database

AMOUNT = {"amount": 700, "currency": "usd"}


@pytest.fixture(scope="module")
def bouncer_url(db_url) -> str:
    url = os.environ.get("IDEM_PY_PGBOUNCER_URL")
    if not url:
        pytest.skip("IDEM_PY_PGBOUNCER_URL is not set (clients/python/test.sh starts PgBouncer and sets it)")
    return with_database(url, "idem_py")


@pytest.fixture(scope="module", params=["asgi", "django"])
def bounced_app(request, bouncer_url, log_dir):
    server = Server(request.param, bouncer_url, log_dir).start()
    yield server
    server.stop()


def count_charges(db_url, tenant):
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT count(*) FROM charges WHERE tenant = %s", (tenant,)).fetchone()[0]


@pytest.mark.parametrize("route", ["/charges", "/charges/external"])
def test_demo_through_pgbouncer(bounced_app, route, db_url):
    """Many requests per pooled connection (past psycopg's prepare threshold), replays and
    a concurrent burst, all through PgBouncer."""
    tenant = "acct_bouncer_" + uuid.uuid4().hex[:8]
    for _ in range(15):
        key = f'"b-{uuid.uuid4()}"'
        first = bounced_app.post(route, AMOUNT, key, tenant)
        again = bounced_app.post(route, AMOUNT, key, tenant)
        assert first.status == 201 and not first.replayed, first
        assert again.status == 201 and again.replayed and again.body == first.body
    assert bounced_app.post(route, {"amount": 1, "currency": "usd"}, key, tenant).is_problem(422)
    key = f'"b-{uuid.uuid4()}"'
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: bounced_app.post(route, AMOUNT, key, tenant), range(12)))
    assert len([r for r in replies if r.status == 201 and not r.replayed]) == 1
    assert all(r.status == 201 or r.is_problem(409) for r in replies)
    assert count_charges(db_url, tenant) == 16


def test_psycopg_default_prepare_threshold_breaks_and_none_works():
    """The reason for the default: on a fresh PgBouncer pool (database alias prep_check),
    a statement prepared on one server connection is missing on the next one."""
    url = os.environ.get("IDEM_PY_PGBOUNCER_URL")
    if not url:
        pytest.skip("IDEM_PY_PGBOUNCER_URL is not set (clients/python/test.sh starts PgBouncer and sets it)")
    url = with_database(url, "prep_check")

    def run(threshold):
        with psycopg.connect(url, autocommit=True, prepare_threshold=threshold) as a, \
                psycopg.connect(url, autocommit=True, prepare_threshold=threshold) as b:
            for _ in range(7):  # prepared after 5 runs (threshold 5) on the pool's only server connection
                a.execute("SELECT idempotency.idem_fingerprint(%s::jsonb)", ('{"a": 1}',)).fetchone()
            b.execute("BEGIN")
            b.execute("SELECT 1")  # b holds that server connection: a's next transaction gets a new one
            try:
                return a.execute("SELECT idempotency.idem_fingerprint(%s::jsonb)", ('{"a": 1}',)).fetchone()[0]
            finally:
                b.execute("ROLLBACK")

    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
        run(5)  # psycopg's default
    assert run(None).startswith("sha256:")
