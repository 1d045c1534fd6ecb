"""Fixtures: a fresh database with the extension on the cluster test.sh started
(IDEM_PY_DATABASE_URL), the demo apps as real servers over real HTTP, and a small HTTP
client. Nothing here is mocked."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "demo"
APPS = {"asgi": DEMO / "run-asgi", "django": DEMO / "run-django"}
TEST_LEASE_MS = 3000
_FIRST_PORT = int(os.environ.get("IDEM_PY_HTTP_PORT") or 0)
_next_port = itertools.count(_FIRST_PORT)


def free_port() -> int:
    """IDEM_PY_HTTP_PORT, +1, +2 ... when set; else a port the kernel hands out."""
    if _FIRST_PORT:
        return next(_next_port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def admin_url() -> str:
    url = os.environ.get("IDEM_PY_DATABASE_URL")
    if not url:
        pytest.exit("IDEM_PY_DATABASE_URL is not set: run clients/python/test.sh", returncode=2)
    return url


def with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def db_url() -> str:
    """A fresh database `idem_py` with the extension."""
    url = admin_url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS idem_py WITH (FORCE)")
        conn.execute("CREATE DATABASE idem_py")
    test_url = with_database(url, "idem_py")
    with psycopg.connect(test_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION idempotency")
        conn.execute("SELECT idempotency.idem_fingerprint('{}'::jsonb)")  # loads the library and its settings
        if has_tombstones(conn):  # for the 410 test; only expired completed records are affected
            conn.execute("ALTER DATABASE idem_py SET idempotency.tombstone_ttl = '1 hour'")
    return test_url


def has_tombstones(conn) -> bool:
    return conn.execute("SELECT count(*) FROM pg_settings WHERE name = 'idempotency.tombstone_ttl'").fetchone()[0] == 1


@pytest.fixture()
def conn(db_url):
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture(scope="session")
def extension_features(db_url):
    from pg_idempotency import Idempotency

    with psycopg.connect(db_url, autocommit=True) as c:
        return Idempotency().features(c)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"

    def json(self):
        return json.loads(self.body)

    def is_problem(self, status: int) -> bool:
        return (self.status == status and self.headers.get("content-type", "").startswith("application/problem+json")
                and json.loads(self.body).get("status") == status)


def request(port: int, method: str, path: str, body: bytes | dict | None = None,
            headers: list[tuple[str, str]] = (), timeout: float = 30) -> Reply:
    """One request on a fresh connection; header lines are sent exactly as given
    (repeated names included)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.putrequest(method, path)
        for name, value in headers:
            c.putheader(name, value.encode("latin-1") if isinstance(value, str) else value)
        if method != "GET":
            c.putheader("Content-Type", "application/json")
            c.putheader("Content-Length", str(len(data)))
        c.endheaders(data if method != "GET" else None)
        r = c.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        c.close()


class ServerExited(RuntimeError):
    pass


class Server:
    """A demo app started with its documented command, over real HTTP."""

    def __init__(self, kind: str, database_url: str, log_dir: Path):
        self.kind, self.database_url, self.log_dir = kind, database_url, log_dir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Server":
        """Starts the app; when it exits at once (its port was taken meanwhile, e.g. as
        another process's ephemeral client port), tries again on another port."""
        for attempt in range(3):
            try:
                return self._start()
            except ServerExited:
                if attempt == 2:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self) -> "Server":
        log = open(self.log_dir / f"{self.kind}-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [str(APPS[self.kind]), "--database-url", self.database_url, "--listen", f"127.0.0.1:{self.port}",
             "--lease-ms", str(TEST_LEASE_MS), "--allow-fault-injection"],
            stdout=log, stderr=log, env={**os.environ, "IDEM_PY_PYTHON": sys.executable},
            start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log.close()
                tail = Path(log.name).read_text(errors="replace").splitlines()[-5:]
                raise ServerExited(f"{self.kind} demo exited with {self.proc.returncode}; {log.name} ends: {tail}")
            try:
                if request(self.port, "GET", "/healthz", timeout=2).body == b"ok\n":
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} demo did not answer /healthz in 30 s; see {log.name}")

    def kill(self) -> None:
        """SIGKILL to the whole process group (gunicorn's worker too)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def post(self, path: str, body, key: str | None, tenant: str | None, extra=()) -> Reply:
        headers = [("X-Api-Key", tenant)] if tenant else []
        if key is not None:
            headers.append(("Idempotency-Key", key))
        return request(self.port, "POST", path, body, headers + list(extra))

    def get(self, path: str, tenant: str | None) -> Reply:
        return request(self.port, "GET", path, None, [("X-Api-Key", tenant)] if tenant else [])


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    d = Path(os.environ.get("IDEM_PY_LOG_DIR") or tmp_path_factory.mktemp("logs"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session", params=sorted(APPS))
def app(request, db_url, log_dir):
    server = Server(request.param, db_url, log_dir).start()
    yield server
    server.stop()


# --- test.sh's second cluster, which tests stop and start again ---------------------------

OUTAGE_DIR = os.environ.get("IDEM_PY_OUTAGE_DIR")


def outage_pg_ctl(*args: str) -> None:
    cmd = [os.path.join(os.environ["IDEM_PY_PGBIN"], "pg_ctl"), "-D", os.path.join(OUTAGE_DIR, "data"), "-w", *args]
    if os.getuid() == 0:  # PostgreSQL refuses to run as root
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, check=True, cwd="/", stdout=subprocess.DEVNULL)


def outage_start() -> None:
    outage_pg_ctl("-l", os.path.join(OUTAGE_DIR, "server.log"), "start")


def outage_database(name: str) -> str:
    """A fresh database with the extension on the outage cluster (skips without it)."""
    if not OUTAGE_DIR:
        pytest.skip("IDEM_PY_OUTAGE_DIR is not set: clients/python/test.sh starts the cluster this test stops")
    url = os.environ["IDEM_PY_OUTAGE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    base, _, query = url.partition("?")
    db_url = with_database(base, name) + "?" + query
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION idempotency")
    return db_url


# --- a receiver of the sender's requests ---------------------------------------------------

class Receiver:
    """Answers POSTs from `script` (a list of (status, headers) used in turn; the last one
    repeats) and logs (path, Idempotency-Key, body) of each. With `hold`, each request waits
    for `release` (set) before it is answered; `arrived` is set when one came."""

    def __init__(self, script=((201, {}),), hold: bool = False):
        self.script = list(script)
        self.log: list[tuple[str, str, bytes]] = []
        self.arrived = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.log.append((self.path, self.headers.get("Idempotency-Key"), body))
                n = len(receiver.log)
                receiver.arrived.set()
                receiver.release.wait(60)
                status, headers = receiver.script[min(n, len(receiver.script)) - 1]
                answer = json.dumps({"n": n}).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/charges"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def keys(self) -> set[str]:
        return {k for _, k, _ in self.log}

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
