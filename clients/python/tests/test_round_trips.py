"""How many round trips to PostgreSQL a protected request costs, seen on the wire: the demo
apps (real servers, real HTTP) talk to the database through a TCP proxy that records what the
application sends in each of its turns (a turn: the bytes it sends before the server answers)."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from conftest import Server

AMOUNT = {"amount": 500, "currency": "eur"}


class TurnRecorder:
    """A TCP proxy that records, per connection, each turn of the client once its startup is
    over (after the server's first ReadyForQuery). `hold_rollback`: a turn holding ROLLBACK is
    kept back until `release()`."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.turns: list[bytes] = []
        self.hold_rollback = False
        self.holding = threading.Event()
        self.released = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        u = urlsplit(database_url)
        return f"postgresql://{u.username}@127.0.0.1:{self.port}{u.path}?sslmode=disable&gssencmode=disable"

    def release(self) -> None:
        self.released.set()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.upstream)
            state = {"ready": False, "client_turn": None}
            threading.Thread(target=self._from_client, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._from_server, args=(server, client, state), daemon=True).start()

    def _from_client(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            self._pump_client(client, server, state)
        except OSError:  # the other side went away
            pass
        _close(server)

    def _from_server(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            self._pump_server(server, client, state)
        except OSError:
            pass
        _close(client)

    def _pump_client(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        while data := client.recv(65536):
            with self.lock:
                if state["ready"]:
                    if state["client_turn"] is None:
                        state["client_turn"] = len(self.turns)
                        self.turns.append(b"")
                    self.turns[state["client_turn"]] += data
            if self.hold_rollback and b"ROLLBACK" in data:
                self.holding.set()
                self.released.wait(30)
            server.sendall(data)

    def _pump_server(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        pending = b""
        while data := server.recv(65536):
            with self.lock:
                state["client_turn"] = None
            pending += data
            if not state["ready"] and pending == b"N":  # "no" to an SSL or GSS encryption request
                pending = b""
            while len(pending) >= 5:  # typed messages: type byte, length (itself included)
                length = struct.unpack("!I", pending[1:5])[0]
                if len(pending) < 1 + length:
                    break
                if pending[:1] == b"Z":
                    state["ready"] = True
                pending = pending[1 + length:]
            client.sendall(data)

    def since(self, mark: int) -> list[bytes]:
        with self.lock:
            return list(self.turns[mark:])


def _close(sock: socket.socket) -> None:
    """Ends both directions; the thread still reading from `sock` sees its end, not a closed
    descriptor."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def shape(turns: list[bytes]) -> list[str]:
    """Each turn that carries one of the statements the test follows, as those statements.
    Turns with none of them are left out: Django's health check (SELECT 1) and the set-up
    of a connection new to a gunicorn thread are Django's own."""
    words = (b"BEGIN", b"idem_claim", b"INSERT INTO charges", b"idem_complete", b"COMMIT", b"ROLLBACK")
    out = []
    for turn in turns:
        found = [w.decode() for w in words if w in turn]
        if found:
            out.append(" + ".join(found))
    return out


@pytest.fixture(scope="module", params=["asgi", "django"])
def proxied(request, db_url, log_dir):
    recorder = TurnRecorder((urlsplit(db_url).hostname, urlsplit(db_url).port))
    server = Server(request.param, recorder.url(db_url), log_dir).start()
    yield request.param, server, recorder
    recorder.release()
    server.stop()


def settle(recorder: TurnRecorder, mark: int, want: int) -> list[bytes]:
    """The turns since `mark` once there are `want` of ours, and a moment later (a ROLLBACK sent
    after the answer arrives after it)."""
    deadline = time.monotonic() + 10
    while len(shape(recorder.since(mark))) < want and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    return recorder.since(mark)


FRESH = {"asgi": ["BEGIN + idem_claim", "INSERT INTO charges", "idem_complete + COMMIT"],
         "django": ["BEGIN", "idem_claim", "INSERT INTO charges", "idem_complete + COMMIT"]}
REPLAY = {"asgi": ["BEGIN + idem_claim", "ROLLBACK"],
          "django": ["BEGIN", "idem_claim", "COMMIT"]}  # Django's atomic() ends a writeless transaction so


def test_fresh_key_and_replay_round_trips(proxied):
    kind, server, recorder = proxied
    tenant = "acct_" + uuid.uuid4().hex[:10]
    assert server.post("/charges", AMOUNT, f'"{uuid.uuid4()}"', tenant).status == 201  # features known
    key = f'"{uuid.uuid4()}"'
    mark = len(recorder.since(0))
    assert server.post("/charges", AMOUNT, key, tenant).status == 201
    assert shape(settle(recorder, mark, len(FRESH[kind]))) == FRESH[kind]

    mark = len(recorder.since(0))
    replay = server.post("/charges", AMOUNT, key, tenant)
    assert replay.status == 201 and replay.replayed
    assert shape(settle(recorder, mark, len(REPLAY[kind]))) == REPLAY[kind]


def test_replay_answered_before_its_rollback(proxied):
    """The ROLLBACK of a replay is held at the proxy: the FastAPI app answers all the same
    (the answer does not wait for the transaction's end)."""
    kind, server, recorder = proxied
    if kind == "django":
        pytest.skip("Django (WSGI) ends its transaction inside the request, before the answer goes out")
    tenant = "acct_" + uuid.uuid4().hex[:10]
    key = f'"{uuid.uuid4()}"'
    assert server.post("/charges", AMOUNT, key, tenant).status == 201
    recorder.released.clear()
    recorder.holding.clear()
    recorder.hold_rollback = True
    try:
        with ThreadPoolExecutor(1) as pool:
            replay = pool.submit(server.post, "/charges", AMOUNT, key, tenant).result(timeout=20)
        assert replay.status == 201 and replay.replayed
        assert recorder.holding.wait(10), "the replay's ROLLBACK was never sent"
    finally:
        recorder.hold_rollback = False
        recorder.release()
    assert server.post("/charges", AMOUNT, key, tenant).replayed  # the connection went back to the pool
