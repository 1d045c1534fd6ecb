"""The database restarted, stopped and started again under running apps: test.sh's second
cluster (IDEM_PY_OUTAGE_DIR), which these tests stop and start with pg_ctl.

Every pool kind the package supports, each in an app as an application writes it: psycopg_pool
(the README's example app, examples/orders.py, as it is), SQLAlchemy's EnginePool
(examples/orders_sqlalchemy.py, as it is) and Django's persistent connections
(tests/apps/django_drf.py under gunicorn, without Django's health checks):
- restarted while the app is idle: the next requests succeed, the first one included (a pooled
  connection the server closed is replaced before anything is sent on it), and nothing
  unhandled reaches the server's log;
- stopped while the app is busy: every answer is 201 or 503 application/problem+json (the
  contract's service-unavailable) with Retry-After, each 503 within 2 s (the middleware's own
  bound on waiting for a connection), no other 5xx, the server lives on; every key answered
  201 has its one row and every key answered 503 none (503 says nothing was done); started
  again: requests succeed, the keys refused meanwhile included.

And the demo apps (psycopg_pool with a 5 s pool timeout; Django with health checks): while the
database is down every answer is the 503 within 2 s, never a framework's error page; once it
is back nothing was lost: a key refused meanwhile runs once, an earlier key replays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from conftest import APPS, OUTAGE_DIR, Server, free_port, outage_pg_ctl as pg_ctl, request, with_database

AMOUNT = {"amount": 700, "currency": "eur"}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TEST_APPS = Path(__file__).resolve().parent / "apps"
BOUND_S = 2.0  # the contract's "503 within 2 s"
# What an exception escaping to the server would have written (uvicorn, gunicorn, Django).
UNHANDLED = ("Traceback", "Exception in ASGI application", "Internal Server Error", "Error handling request")


def start_database() -> None:
    pg_ctl("-l", os.path.join(OUTAGE_DIR, "server.log"), "start")


def outage_database(name: str) -> str:
    """A fresh database NAME with the extension on the outage cluster; its URL."""
    if not OUTAGE_DIR:
        pytest.skip("IDEM_PY_OUTAGE_DIR is not set: clients/python/test.sh starts the cluster these tests stop")
    url = os.environ["IDEM_PY_OUTAGE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    base, _, query = url.partition("?")
    db_url = with_database(base, name) + "?" + query
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION idempotency")
    return db_url


@pytest.fixture(scope="module")
def outage_db():
    return outage_database("idem_outage")


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


def timed(call):
    t0 = time.monotonic()
    reply = call()
    return reply, time.monotonic() - t0


def unhandled(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if any(u in line for u in UNHANDLED)]


# --- every pool kind ---------------------------------------------------------------------------

class App:
    """One app of POST /orders ({"item", "quantity"} -> 201), started as its README says (uvicorn
    or gunicorn) against its own database on the outage cluster."""

    def __init__(self, kind: str, argv: list[str], app_url: str, url: str, log_dir: Path):
        self.kind, self.url, self.port = kind, url, free_port()
        self.log = log_dir / f"outage-{kind}-{self.port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", *argv, *self.listen_args(argv[0])],
                                         stdout=out, stderr=out, env={**os.environ, "DATABASE_URL": app_url})
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"{kind} exited; see {self.log}"
            assert time.monotonic() < deadline, f"{kind} did not answer in 30 s; see {self.log}"
            try:
                request(self.port, "GET", "/", timeout=2)  # any answer: it listens
                return
            except OSError:
                time.sleep(0.1)

    def listen_args(self, server: str) -> list[str]:
        if server == "uvicorn":
            return ["--host", "127.0.0.1", "--port", str(self.port)]
        return ["-b", f"127.0.0.1:{self.port}"]

    def post(self, key: str, item: str | None = None):
        headers = [("X-Api-Key", "t-outage"), ("Idempotency-Key", f'"{key}"')]
        return request(self.port, "POST", "/orders", {"item": item or key, "quantity": 1}, headers, timeout=30)

    def rows(self, items: list[str]) -> dict[str, int]:
        with psycopg.connect(self.url) as c:
            found = dict(c.execute("SELECT item, count(*) FROM orders WHERE item = ANY(%s) GROUP BY item",
                                   (items,)).fetchall())
        return {i: found.get(i, 0) for i in items}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


POOL_KINDS = {
    # kind: (the database URL's scheme, the server's argv)
    "psycopg_pool": ("postgresql://", ["uvicorn", "--app-dir", str(EXAMPLES), "orders:app"]),
    "sqlalchemy": ("postgresql+psycopg://", ["uvicorn", "--app-dir", str(EXAMPLES), "orders_sqlalchemy:app"]),
    "django": ("postgresql://", ["gunicorn", "--chdir", str(TEST_APPS), "--threads", "4", "django_drf:application"]),
}


@pytest.fixture(scope="module", params=sorted(POOL_KINDS))
def pool_app(request, log_dir):
    scheme, argv = POOL_KINDS[request.param]
    url = outage_database(f"idem_outage_{request.param}")
    app = App(request.param, argv, url.replace("postgresql://", scheme, 1), url, log_dir)
    yield app
    app.stop()


def new_key() -> str:
    return str(uuid.uuid4())


def test_restart_under_an_idle_app_no_503_the_first_request_included(pool_app):
    with ThreadPoolExecutor(16) as pool:  # several connections in the pool, then idle
        warm = list(pool.map(lambda _: pool_app.post(new_key()), range(32)))
    assert all(r.status == 201 for r in warm), [(r.status, r.body) for r in warm if r.status != 201][:3]
    pg_ctl("-m", "fast", "-l", os.path.join(OUTAGE_DIR, "server.log"), "restart")
    first = pool_app.post(new_key())
    assert first.status == 201 and not first.replayed, first
    with ThreadPoolExecutor(32) as pool:
        after = list(pool.map(lambda _: pool_app.post(new_key()), range(32)))
    assert [r.status for r in after] == [201] * 32, [(r.status, r.body) for r in after if r.status != 201][:3]
    assert pool_app.proc.poll() is None
    assert unhandled(pool_app.log) == [], pool_app.log


def test_stop_under_a_busy_app_only_503_within_the_bound_then_start(pool_app):
    answers: list[tuple[str, object, float, float]] = []  # key, reply, when sent, seconds taken
    stopped_at: list[float] = []
    done = threading.Event()

    def client():
        while not done.is_set():
            key, sent = new_key(), time.monotonic()
            reply, took = timed(lambda key=key: pool_app.post(key))
            answers.append((key, reply, sent, took))

    clients = [threading.Thread(target=client) for _ in range(8)]
    for c in clients:
        c.start()
    try:
        time.sleep(1.5)
        pg_ctl("-m", "fast", "stop")
        stopped_at.append(time.monotonic())
        time.sleep(3)
    finally:
        done.set()
        for c in clients:
            c.join(60)
        if not stopped_at:
            start_database()
    try:
        assert pool_app.proc.poll() is None, f"the server died; see {pool_app.log}"
        odd = [(k, r.status, r.body[:120]) for k, r, _, _ in answers if r.status != 201 and not is_unavailable(r)]
        assert odd == [], odd  # 201 or the 503 problem, nothing else
        refused = [(k, took) for k, r, _, took in answers if r.status == 503]
        after_stop = [k for k, r, sent, _ in answers if sent > stopped_at[0]]
        assert refused and after_stop, "no request while the database was down"
        slow = [took for _, took in refused if took >= BOUND_S]
        assert slow == [], f"503s slower than {BOUND_S} s: {slow[:5]}"
    finally:
        start_database()
    back = until_served(lambda: pool_app.post(new_key()), 30)
    assert back.status == 201, back
    served = [k for k, r, _, _ in answers if r.status == 201]
    assert set(pool_app.rows(served).values()) == {1}, "a key answered 201 without its one row"
    refused_keys = [k for k, _ in refused]
    assert set(pool_app.rows(refused_keys).values()) == {0}, "a key answered 503 has a row: something was done"
    for key in refused_keys[:10]:  # the keys refused while the database was down now run, once
        again = until_served(lambda key=key: pool_app.post(key), 30)
        assert again.status == 201 and not again.replayed, again
    assert set(pool_app.rows(refused_keys[:10]).values()) == {1}
    assert unhandled(pool_app.log) == [], pool_app.log


# --- the demo apps -----------------------------------------------------------------------------

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
                down, took = timed(lambda route=route, key=key: server.post(route, AMOUNT, key, tenant))
                assert is_unavailable(down) and took < BOUND_S, (route, down, took)
            charge_id = before.json()["id"]
            # a route the middleware does not protect
            down, took = timed(lambda: server.get(f"/charges/{charge_id}", tenant))
            assert is_unavailable(down) and took < BOUND_S, (down, took)
        finally:
            start_database()
        for route, key in keys.items():
            first = until_served(lambda route=route, key=key: server.post(route, AMOUNT, key, tenant))
            assert first.status == 201 and not first.replayed, (route, first)
            again = server.post(route, AMOUNT, key, tenant)
            assert again.status == 201 and again.replayed and again.body == first.body, (route, again)
        earlier = server.post("/charges", AMOUNT, earlier_key, tenant)
        assert earlier.status == 201 and earlier.replayed and earlier.body == before.body, earlier
        with psycopg.connect(outage_db) as c:
            assert c.execute("SELECT count(*) FROM charges WHERE tenant = %s", (tenant,)).fetchone()[0] == 3
        assert until_served(lambda: server.get(f"/charges/{charge_id}", tenant)).status == 200
    finally:
        server.stop()
