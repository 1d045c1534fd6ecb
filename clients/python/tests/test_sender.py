"""The sender (pg_idempotency.sender) against the real extension and a real HTTP receiver
(a threading HTTP server in this process that answers from a script and logs every
request's Idempotency-Key)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from conftest import Receiver, free_port
from pg_idempotency.sender import (MAX_RETRY_AFTER, Delivered, NotYet, Sender, Unknown, check_timeout, error_code,
                                   first_line, interval_text, key_header, parse_retry_after, prepare, reconnect_delay,
                                   setting_values)

DEMO = Path(__file__).resolve().parent.parent / "demo" / "send_demo.py"


@pytest.fixture(scope="module")
def send_db(db_url):
    """Quick retries for these tests (the database's default, which the senders' own
    connections read)."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("ALTER DATABASE idem_py SET idempotency.send_backoff_base = '50ms'")
        c.execute("ALTER DATABASE idem_py SET idempotency.send_backoff_cap = '200ms'")
    return db_url


@pytest.fixture()
def receiver():
    r = Receiver()
    yield r
    r.close()


def new_op(name: str) -> str:
    return f"{name}-{time.monotonic_ns()}:charge"


def prepared(db: str, op: str, target: str, request=None, **kw):
    with psycopg.connect(db) as conn:
        p = prepare(conn, "shop", op, target, request if request is not None else {"amount": 1}, **kw)
        conn.commit()
    return p


def sender(db, receiver, target, **kw):
    return Sender(db, urls={target: receiver.url}, lease=timedelta(seconds=5), timeout=2, **kw)


# --- pure rules ------------------------------------------------------------------------------

def test_key_header_is_an_sf_string():
    assert key_header("k-1") == '"k-1"'
    assert key_header('a"b\\c') == '"a\\"b\\\\c"'


def test_retry_after_seconds_and_http_date():
    now = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after("7", now) == timedelta(seconds=7)
    assert parse_retry_after("Thu, 03 Dec 2026 12:00:30 GMT", now) == timedelta(seconds=30)
    assert parse_retry_after("9" * 30, now) == MAX_RETRY_AFTER
    assert parse_retry_after("\u00b2", now) is None  # a digit to str.isdigit, not to HTTP
    assert parse_retry_after("Thu, 03 Dec 2026 11:00:00 GMT", now) == timedelta(0)
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


def test_a_timeout_must_be_positive_and_below_the_lease():
    check_timeout(1.0, timedelta(seconds=1.5))
    for timeout, lease in ((1.5, 1.5), (30, 10)):
        with pytest.raises(ValueError, match=r"timeout \(.* s\) must be below the lease"):
            check_timeout(timeout, timedelta(seconds=lease))
    for timeout in (0, -1, math.nan, math.inf, "1"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            check_timeout(timeout, timedelta(seconds=10))


def test_setting_values_are_checked_and_only_those_given():
    assert setting_values() == {}
    assert setting_values(0, timedelta(milliseconds=50), timedelta(minutes=2)) == {
        "idempotency.send_retry_budget": "0.0",
        "idempotency.send_backoff_base": "0.050000 seconds",
        "idempotency.send_backoff_cap": "120.000000 seconds"}
    assert setting_values(retry_budget=0.25) == {"idempotency.send_retry_budget": "0.25"}
    for budget in (-0.1, math.nan, math.inf, 1_000_001, "0.1"):
        with pytest.raises(ValueError, match="retry_budget must be a number from 0 to"):
            setting_values(retry_budget=budget)
    for bad in (timedelta(0), timedelta(seconds=-1), timedelta(days=3_600_000, microseconds=1)):
        with pytest.raises(ValueError, match="backoff_cap must be a positive interval"):
            setting_values(backoff_cap=bad)


def test_interval_text_is_exact_to_the_microsecond():
    assert interval_text(timedelta(days=1, seconds=2, microseconds=5)) == "86402.000005 seconds"
    assert interval_text(timedelta(milliseconds=1)) == "0.001000 seconds"


def test_reconnect_delay_is_full_jitter_below_an_exponential_bound():
    top = [reconnect_delay(n, 0.1, 5.0, rand=lambda: 1.0) for n in range(1, 10)]
    assert top == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    assert reconnect_delay(3, 0.1, 5.0, rand=lambda: 0.0) == 0.0
    assert reconnect_delay(3, 0.1, 5.0, rand=lambda: 0.5) == pytest.approx(0.2)
    assert reconnect_delay(10_000, 0.1, 5.0, rand=lambda: 1.0) == 5.0  # no overflow


def test_error_code_is_the_sqlstate_or_the_class():
    assert error_code(psycopg.errors.DeadlockDetected("deadlock detected")) == "40P01"
    assert error_code(psycopg.errors.SerializationFailure("x")) == "40001"
    assert error_code(psycopg.errors.AdminShutdown("x")) == "57P01"
    assert error_code(psycopg.OperationalError("connection refused")) == "OperationalError"
    assert first_line(psycopg.OperationalError("connection failed\n\tIs the server running?")) == "connection failed"


def test_the_longest_backoff_the_sender_allows_is_one_the_database_takes(send_db):
    """The sender's limit is the extension's (10000 years, as PostgreSQL compares intervals):
    a result recorded with the longest cap and base the sender allows is no error."""
    r = Receiver([(503, {})])
    try:
        op = new_op("longest")
        prepared(send_db, op, "t-longest")
        longest = timedelta(days=3_600_000)
        with sender(send_db, r, "t-longest", backoff_base=longest, backoff_cap=longest) as s:
            result = s.deliver("shop", op)
        assert isinstance(result, (NotYet, Unknown)) and result.last_status == 503, result
    finally:
        r.close()


def test_the_settings_text_is_what_the_database_reads(send_db):
    values = setting_values(0.5, timedelta(milliseconds=50), timedelta(days=2, microseconds=7))
    with psycopg.connect(send_db) as c:
        for name, value in values.items():
            c.execute("SELECT set_config(%s, %s, true)", (name, value))
        got = c.execute("SELECT current_setting('idempotency.send_retry_budget')::float8, "
                        "current_setting('idempotency.send_backoff_base')::interval, "
                        "current_setting('idempotency.send_backoff_cap')::interval").fetchone()
    assert got == (0.5, timedelta(milliseconds=50), timedelta(days=2, microseconds=7))


def test_a_sender_needs_a_way_to_send_a_timeout_below_its_lease_and_good_settings(send_db):
    with pytest.raises(ValueError, match="give urls"):
        Sender(send_db)
    urls = {"t": "http://127.0.0.1:9/"}
    with pytest.raises(ValueError, match="must be below the lease"):
        Sender(send_db, urls=urls, timeout=30, lease=timedelta(seconds=10))
    with pytest.raises(ValueError, match="must be below the lease"):
        Sender(send_db, urls=urls, timeout=10, lease=timedelta(seconds=10))
    with pytest.raises(ValueError, match="retry_budget"):
        Sender(send_db, urls=urls, retry_budget=-1)
    with pytest.raises(ValueError, match="give_up_after"):
        Sender(send_db, urls=urls, give_up_after=timedelta(0))


# --- an attempt bounded in total by the timeout ------------------------------------------------

class TrickleReceiver:
    """Answers every request slowly, a byte every `every` seconds (so no socket read waits
    long enough for a per-read timeout): the body (`part="body"`, the headers sent at once)
    or the headers themselves (`part="headers"`). Records, per request, the seconds from its
    arrival to the moment the client closed the connection (None: it never did)."""

    def __init__(self, part: str, every: float = 0.1):
        self.closed_after: list[float | None] = []
        self.sock = socket.create_server(("127.0.0.1", free_port()))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/charges"
        self.part, self.every = part, every
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: socket.socket):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            request_head, _, request_body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in request_head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(request_body) < length:  # the whole request: what is left unread is the client's EOF
                request_body += conn.recv(65536)
            arrived = time.monotonic()
            body = json.dumps({"padding": "x" * 200}).encode()
            head = f"HTTP/1.1 201 Created\r\nContent-Length: {len(body)}\r\nX-Pad: {'y' * 200}\r\n\r\n".encode()
            slow = head + body if self.part == "headers" else body
            if self.part == "body":
                conn.sendall(head)
            self.closed_after.append(None)
            conn.settimeout(self.every)
            for i in range(len(slow)):
                try:
                    conn.sendall(slow[i:i + 1])
                    if conn.recv(1, socket.MSG_PEEK) == b"":
                        break
                except socket.timeout:
                    continue  # nothing from the client: it is still reading
                except OSError:
                    break
            self.closed_after[-1] = time.monotonic() - arrived

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("part", ["body", "headers"])
def test_an_attempt_ends_by_its_timeout_however_slowly_the_answer_comes(send_db, part):
    """Timeout 1 s against an answer that would take 40 s at a byte every 100 ms: the attempt
    is no answer ("timed out") after 1 s (bounded here with a generous margin), the sender
    closed its connection then, and the send is pending for its retry."""
    r = TrickleReceiver(part)
    try:
        op = new_op(f"trickle-{part}")
        prepared(send_db, op, "t-trickle")
        with Sender(send_db, urls={"t-trickle": r.url}, timeout=1, lease=timedelta(seconds=5)) as s:
            began = time.monotonic()
            result = s.deliver("shop", op)
            took = time.monotonic() - began
        assert isinstance(result, NotYet) and result.state == "pending", result
        assert result.last_status is None and result.last_error == "timed out"
        assert took < 2.0, f"the attempt took {took:.2f} s"
        assert wait_until(lambda: r.closed_after and r.closed_after[0] is not None, 5)
        assert r.closed_after[0] < 1.5, f"the sender closed its connection {r.closed_after[0]:.2f} s after the request"
    finally:
        r.close()


def wait_until(what, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.02)
    return bool(what())


# --- prepare, in the caller's transaction ----------------------------------------------------

def test_prepare_is_part_of_the_callers_transaction(send_db):
    op = new_op("rolled-back")
    with psycopg.connect(send_db) as conn:
        p = prepare(conn, "shop", op, "t-rollback", {"amount": 1})
        assert p.state == "pending" and len(p.key) == 36
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM idempotency.outbound WHERE operation = %s", (op,)).fetchone()[0] == 0


def test_prepare_twice_returns_the_same_key(send_db):
    op = new_op("twice")
    first = prepared(send_db, op, "t-twice")
    again = prepared(send_db, op, "t-twice")
    assert again.key == first.key
    with psycopg.connect(send_db) as conn:
        with pytest.raises(psycopg.Error) as e:
            prepare(conn, "shop", op, "t-twice", {"amount": 2})
        assert e.value.sqlstate == "IK004"


# --- deliver, right after COMMIT -------------------------------------------------------------

def test_deliver_sends_once_with_the_key_and_returns_the_answer(send_db, receiver):
    op = new_op("deliver")
    p = prepared(send_db, op, "t-deliver", {"amount": 5, "currency": "eur"})
    with sender(send_db, receiver, "t-deliver") as s:
        result = s.deliver("shop", op)
        assert isinstance(result, Delivered) and result.status == 201 and result.json() == {"n": 1}
        # Done: asking again sends nothing and answers from the record.
        again = s.deliver("shop", op)
        assert isinstance(again, Delivered) and again.status == 201
    assert [(k, json.loads(b)) for _, k, b in receiver.log] == [(key_header(p.key), {"amount": 5, "currency": "eur"})]
    assert prepared(send_db, op, "t-deliver", {"amount": 5, "currency": "eur"}).response.status == 201


def test_a_final_4xx_is_done_and_not_retried(send_db):
    r = Receiver([(422, {})])
    try:
        op = new_op("declined")
        prepared(send_db, op, "t-422")
        with sender(send_db, r, "t-422") as s:
            result = s.deliver("shop", op)
            assert isinstance(result, Delivered) and result.status == 422
            assert s.run_once("t-422") == 0
        assert len(r.log) == 1
    finally:
        r.close()


# --- the worker ------------------------------------------------------------------------------

def test_the_worker_retries_503_with_the_same_key(send_db):
    r = Receiver([(503, {}), (503, {}), (201, {})])
    try:
        op = new_op("retry")
        p = prepared(send_db, op, "t-503")
        finished = []
        with sender(send_db, r, "t-503", on_finished=lambda a, res: finished.append(res)) as s:
            s.run("t-503", until_idle=True)
        assert len(r.log) == 3 and r.keys() == {key_header(p.key)}
        assert isinstance(finished[0], Delivered) and finished[0].status == 201
        with psycopg.connect(send_db) as conn:
            state, attempts = conn.execute("SELECT state, attempts FROM idempotency.outbound WHERE operation = %s",
                                           (op,)).fetchone()
        assert (state, attempts) == ("done", 3)
    finally:
        r.close()


def test_429_with_retry_after_is_not_retried_before_it(send_db):
    r = Receiver([(429, {"Retry-After": "2"}), (201, {})])
    try:
        op = new_op("slow-down")
        prepared(send_db, op, "t-429")
        with sender(send_db, r, "t-429") as s:
            before = datetime.now(timezone.utc)
            result = s.deliver("shop", op)
            assert isinstance(result, NotYet) and result.state == "pending" and result.last_status == 429
            assert result.next_attempt_at >= before + timedelta(seconds=2)
            assert s.run_once("t-429") == 0  # not due yet
    finally:
        r.close()


def test_a_receiver_that_is_down_is_no_answer_and_stays_pending(send_db):
    op = new_op("down")
    prepared(send_db, op, "t-down")
    port = free_port()  # nothing listens there
    urls = {"t-down": f"http://127.0.0.1:{port}/charges"}
    with Sender(send_db, urls=urls, lease=timedelta(seconds=5), timeout=2) as s:
        result = s.deliver("shop", op)
    assert isinstance(result, NotYet) and result.state == "pending"
    assert result.last_status is None and result.last_error.startswith("connection failed")


def test_no_final_answer_before_give_up_after_is_unknown(send_db):
    r = Receiver([(503, {})])
    try:
        op = new_op("give-up")
        prepared(send_db, op, "t-give-up", give_up_after=timedelta(milliseconds=300))
        finished = []
        with sender(send_db, r, "t-give-up", on_finished=lambda a, res: finished.append(res)) as s:
            s.run("t-give-up", until_idle=True)
            final = s.status("shop", op)
        assert isinstance(final, Unknown) and final.last_status == 503
        # Gave up at a result (Unknown), or while waiting for its retry (idem_send_next marks
        # it without an attempt): never reported as delivered.
        assert not any(isinstance(x, Delivered) for x in finished)
        assert len(r.log) >= 1 and len(r.keys()) == 1
    finally:
        r.close()


def test_the_worker_wakes_on_notify_not_on_its_poll(send_db, receiver):
    """Poll interval 60 s: a send committed while the worker waits is sent once its NOTIFY
    arrives (the bound here is generous; it only tells a wake-up from a poll)."""
    stop = threading.Event()
    with sender(send_db, receiver, "t-notify", poll_interval=60) as s:
        worker = threading.Thread(target=s.run, args=("t-notify",), kwargs={"stop": stop})
        worker.start()
        try:
            time.sleep(0.5)  # the worker has found nothing and waits
            prepared(send_db, new_op("notify"), "t-notify")
            assert receiver.arrived.wait(20), "the worker did not wake up on the NOTIFY"
        finally:
            stop.set()
            with psycopg.connect(send_db, autocommit=True) as c:
                c.execute("NOTIFY idempotency_send, 't-notify'")
            worker.join(30)
    assert not worker.is_alive()


# --- the send demo program -------------------------------------------------------------------

def test_the_send_demo_program(send_db, receiver):
    env = {**os.environ, "DATABASE_URL": send_db, "RECEIVER_URL": receiver.url, "TARGET": "t-demo",
           "SEND_LEASE_MS": "5000", "SEND_TIMEOUT_MS": "2000"}
    prefix = f"demo{time.monotonic_ns()}"

    def run(*args):
        return subprocess.run([sys.executable, str(DEMO), *args], env=env, capture_output=True, text=True,
                              timeout=120)

    out = run("prepare", "3", prefix)
    assert out.returncode == 0 and out.stdout.strip() == "prepared 3", out.stderr
    out = run("work", "--until-idle")
    assert out.returncode == 0, out.stderr
    assert sorted(line for line in out.stdout.splitlines() if line.startswith("finished")) == \
        [f"finished {prefix}-{i}:charge done 201" for i in (1, 2, 3)]
    out = run("inline", "2", prefix + "i")
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stdout.splitlines() if line.startswith("delivered")] == \
        [f"delivered {prefix}i-{i}:charge done 201" for i in (1, 2)]
    assert len(receiver.log) == 5 and len(receiver.keys()) == 5
    with psycopg.connect(send_db) as conn:
        kept = conn.execute("SELECT count(*) FROM send_demo_orders AS o JOIN idempotency.outbound AS s "
                            "ON s.key = o.payment_key WHERE o.id LIKE %s", (prefix + "%",)).fetchone()[0]
    assert kept == 5
