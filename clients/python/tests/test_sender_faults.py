"""The sender's worker outlives its database (issue 32), and its own settings: real servers,
real sessions. Its backends terminated (pg_terminate_backend), its server stopped and started
again under it (test.sh's outage cluster: connection refused meanwhile), a real deadlock,
a serialization failure: the worker logs each error (logger pg_idempotency.sender),
reconnects and goes on; the answer of an attempt in flight is recorded after reconnecting
while its lease holds, and is otherwise left to be taken again."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from conftest import Receiver, outage_database, outage_pg_ctl, outage_start, with_database
from pg_idempotency.sender import Sender, error_code, prepare

APP = "idem-sender-faults"  # the application_name of the senders' sessions here: only they are terminated
LOGGER = "pg_idempotency.sender"


def new_op(name: str) -> str:
    return f"{name}-{time.monotonic_ns()}:charge"


def prepared(db: str, op: str, target: str) -> None:
    with psycopg.connect(db) as conn:
        prepare(conn, "shop", op, target, {"amount": 1})
        conn.commit()


def state(db: str, op: str) -> tuple[str, int] | None:
    with psycopg.connect(db) as conn:
        return conn.execute("SELECT state, attempts FROM idempotency.outbound WHERE operation = %s", (op,)).fetchone()


def wait_until(what, seconds: float = 30) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.05)
    return bool(what())


def as_app(db: str) -> str:
    return db + ("&" if "?" in db else "?") + f"application_name={APP}"


def fast_sender(db: str, url: str, target: str, **kw) -> Sender:
    """Quick retries and reconnections: the sender's own settings, not the database's."""
    return Sender(as_app(db), urls={target: url}, backoff_base=timedelta(milliseconds=50),
                  backoff_cap=timedelta(milliseconds=200), reconnect_base=0.05, reconnect_cap=0.5,
                  poll_interval=0.2, **kw)


class Worker:
    """Sender.run in a thread; `finish` stops it and checks that it ended only then."""

    def __init__(self, sender: Sender, target: str):
        self.stop = threading.Event()
        self.raised: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(sender, target))
        self.thread.start()

    def _run(self, sender: Sender, target: str) -> None:
        try:
            sender.run(target, stop=self.stop)
        except BaseException as e:
            self.raised.append(e)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def finish(self) -> None:
        assert self.alive() and not self.raised, f"the worker ended before its stop signal: {self.raised}"
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive() and not self.raised, self.raised


def db_errors(caplog) -> list[str]:
    return [error_code(r.db_error) for r in caplog.records if hasattr(r, "db_error")]


def reconnections(caplog) -> int:
    return sum(1 for r in caplog.records if getattr(r, "db_reconnected", False))


def messages(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == LOGGER)


@pytest.fixture()
def caplog_sender(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    return caplog


def test_backends_terminated_the_answer_in_flight_recorded_after_reconnecting(db_url, caplog_sender):
    r = Receiver(hold=True)
    op, then = new_op("terminated"), new_op("terminated-then")
    prepared(db_url, op, "t-terminated")
    try:
        with fast_sender(db_url, r.url, "t-terminated", lease=timedelta(seconds=10), timeout=5) as s:
            w = Worker(s, "t-terminated")
            try:
                assert r.arrived.wait(20)
                with psycopg.connect(db_url, autocommit=True) as c:
                    terminated = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                           "WHERE application_name = %s", (APP,)).fetchone()[0]
                assert terminated == 2  # its two sessions: the extension's calls and LISTEN
                r.release.set()
                assert wait_until(lambda: state(db_url, op)[0] == "done"), state(db_url, op)
                prepared(db_url, then, "t-terminated")  # and it goes on
                assert wait_until(lambda: state(db_url, then)[0] == "done"), state(db_url, then)
            finally:
                w.finish()
    finally:
        r.close()
    assert state(db_url, op) == ("done", 1), "recorded after reconnecting, not taken again"
    assert len(r.log) == 2
    assert db_errors(caplog_sender)[:1] in (["57P01"], ["OperationalError"]), db_errors(caplog_sender)
    assert reconnections(caplog_sender) >= 1
    assert "recorded the answer to shop / " + op + " (attempt 1) after reconnecting" in messages(caplog_sender)
    assert all(r.levelno == logging.WARNING for r in caplog_sender.records if hasattr(r, "db_error"))


@pytest.fixture(scope="module")
def outage_send_db():
    return outage_database("idem_send_outage")


def test_the_server_restarted_under_the_worker(outage_send_db, caplog_sender):
    """Stopped while an attempt is in flight, down for a second (connection refused, again
    and again), started again: the worker lived through it and recorded the answer (the
    lease of 10 s still held)."""
    db = outage_send_db
    r = Receiver(hold=True)
    op, then = new_op("restart"), new_op("restart-then")
    prepared(db, op, "t-restart")
    try:
        with fast_sender(db, r.url, "t-restart", lease=timedelta(seconds=10), timeout=5) as s:
            w = Worker(s, "t-restart")
            try:
                assert r.arrived.wait(20)
                outage_pg_ctl("-m", "fast", "stop")
                try:
                    r.release.set()
                    time.sleep(1.5)
                    assert w.alive()
                    while_down = len(db_errors(caplog_sender))
                finally:
                    outage_start()
                assert wait_until(lambda: state(db, op)[0] == "done"), state(db, op)
                prepared(db, then, "t-restart")
                assert wait_until(lambda: state(db, then)[0] == "done"), state(db, then)
            finally:
                w.finish()
    finally:
        r.close()
    assert while_down >= 2, f"the shutdown and the refused connections after it: {db_errors(caplog_sender)}"
    assert "OperationalError" in db_errors(caplog_sender)  # a connection refused has no SQLSTATE
    assert reconnections(caplog_sender) >= 1
    assert state(db, op) == ("done", 1) and len(r.log) == 2


def test_down_longer_than_the_lease_the_send_is_taken_again(outage_send_db, caplog_sender):
    """The answer came while the server was down, and the lease (2 s) ended before it was
    back: the answer is dropped, not recorded late, and the send is taken again (attempt 2,
    the same key; the receiver replays in real life)."""
    db = outage_send_db
    r = Receiver(hold=True)
    op = new_op("lease-ended")
    prepared(db, op, "t-lease-ended")
    try:
        with fast_sender(db, r.url, "t-lease-ended", lease=timedelta(seconds=2), timeout=1.5) as s:
            w = Worker(s, "t-lease-ended")
            try:
                assert r.arrived.wait(20)
                outage_pg_ctl("-m", "fast", "stop")
                try:
                    r.release.set()
                    time.sleep(2.5)
                finally:
                    outage_start()
                assert wait_until(lambda: state(db, op)[0] == "done"), state(db, op)
            finally:
                w.finish()
    finally:
        r.close()
    assert state(db, op) == ("done", 2)
    assert len(r.log) == 2 and len(r.keys()) == 1
    assert f"the answer to shop / {op} (attempt 1) was not recorded before its lease ended" in messages(caplog_sender)


@pytest.fixture()
def trigger(db_url):
    """Installs a BEFORE UPDATE trigger on idempotency.outbound for one target only (the
    sender's recording of a result), and drops it after the test."""
    made = []

    def install(target: str, body: str) -> None:
        name = "test_sender_" + target.replace("-", "_")
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute(f"CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} "
                      "RETURN NEW; END $$")
            c.execute(f"CREATE TRIGGER {name} BEFORE UPDATE ON idempotency.outbound FOR EACH ROW "
                      f"WHEN (NEW.target = '{target}' AND NEW.state <> 'sending') EXECUTE FUNCTION public.{name}()")
        made.append(name)

    yield install
    with psycopg.connect(db_url, autocommit=True) as c:
        for name in made:
            c.execute(f"DROP TRIGGER {name} ON idempotency.outbound")
            c.execute(f"DROP FUNCTION public.{name}()")
            c.execute(f"DROP SEQUENCE IF EXISTS public.{name}_seq")


def test_a_deadlock_while_recording(db_url, caplog_sender, trigger):
    """A real deadlock: the sender's recording holds the send's row and waits for an advisory
    lock (a trigger of this test takes it) that another session holds, which then asks for
    the row. PostgreSQL's deadlock detector aborts the sender's transaction (its
    deadlock_timeout, 1 s, is the shorter); the worker reconnects and records the answer."""
    trigger("t-deadlock", "PERFORM pg_advisory_xact_lock(4242);")
    r = Receiver()
    op = new_op("deadlock")
    prepared(db_url, op, "t-deadlock")
    try:
        with psycopg.connect(db_url) as holder:
            holder.execute("SET LOCAL deadlock_timeout = '30s'")
            holder.execute("SELECT pg_advisory_xact_lock(4242)")
            with fast_sender(db_url, r.url, "t-deadlock", lease=timedelta(seconds=20), timeout=5) as s:
                w = Worker(s, "t-deadlock")
                try:
                    with psycopg.connect(db_url, autocommit=True) as c:
                        assert wait_until(lambda: c.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                            "AND wait_event = 'advisory'", (APP,)).fetchone()[0] == 1)
                    holder.execute("SELECT 1 FROM idempotency.outbound WHERE operation = %s FOR UPDATE", (op,))
                    holder.rollback()
                    assert wait_until(lambda: state(db_url, op)[0] == "done"), state(db_url, op)
                finally:
                    w.finish()
    finally:
        r.close()
    assert "40P01" in db_errors(caplog_sender), db_errors(caplog_sender)
    assert reconnections(caplog_sender) >= 1
    assert state(db_url, op) == ("done", 1) and len(r.log) == 1


def test_a_serialization_failure_while_recording(db_url, caplog_sender, trigger):
    """40001 (raised once by a trigger of this test: the sender's READ COMMITTED transactions
    meet it from functions of the application, e.g. on a table the trigger writes)."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("CREATE SEQUENCE public.test_sender_t_serialization_seq")
    trigger("t-serialization", "IF nextval('public.test_sender_t_serialization_seq') = 1 THEN "
            "RAISE EXCEPTION 'could not serialize access (this test)' USING ERRCODE = 'serialization_failure'; "
            "END IF;")
    r = Receiver()
    op = new_op("serialization")
    prepared(db_url, op, "t-serialization")
    try:
        with fast_sender(db_url, r.url, "t-serialization", lease=timedelta(seconds=10), timeout=5) as s:
            w = Worker(s, "t-serialization")
            try:
                assert wait_until(lambda: state(db_url, op)[0] == "done"), state(db_url, op)
            finally:
                w.finish()
    finally:
        r.close()
    assert db_errors(caplog_sender) == ["40001"]
    assert reconnections(caplog_sender) == 1
    assert state(db_url, op) == ("done", 1) and len(r.log) == 1


# --- the sender's own settings ---------------------------------------------------------------

def test_the_senders_give_up_after(db_url):
    op, other = new_op("give-up-90"), new_op("give-up-30")
    with Sender(db_url, urls={"t": "http://127.0.0.1:9/"}, give_up_after=timedelta(seconds=90)) as s, \
            psycopg.connect(db_url) as conn:
        s.prepare(conn, "shop", op, "t-give-up-after", {"amount": 1})
        s.prepare(conn, "shop", other, "t-give-up-after", {"amount": 1}, give_up_after=timedelta(seconds=30))
        conn.commit()
        rows = dict(conn.execute("SELECT operation, give_up_at - created_at FROM idempotency.outbound "
                                 "WHERE operation IN (%s, %s)", (op, other)).fetchall())
    assert rows == {op: timedelta(seconds=90), other: timedelta(seconds=30)}


def test_budget_and_backoff_of_the_sender_per_transaction_through_pgbouncer(db_url):
    """Two senders through PgBouncer (transaction pooling) with their own budget and backoff:
    12 first attempts answered 503; each retry due within the senders' cap (1 ms, where the
    database's is 200 ms); the sender with budget 0 hands out no retry, the one with budget 6
    all 12 (floor((6 x 12 + 10) / 6) = 13 over the window's last sixth); and no other
    transaction sees their values (set_config(..., true))."""
    url = os.environ.get("IDEM_PY_PGBOUNCER_URL")
    if not url:
        pytest.skip("IDEM_PY_PGBOUNCER_URL is not set (clients/python/test.sh starts PgBouncer and sets it)")
    bounced = with_database(url, "idem_py")
    target = f"t-budget-{time.monotonic_ns()}"
    ops = [new_op(f"budget-{i}") for i in range(12)]
    for op in ops:
        prepared(db_url, op, target)
    r = Receiver([(503, {})])
    tiny = timedelta(milliseconds=1)
    common = dict(urls={target: r.url}, timeout=2, lease=timedelta(seconds=5), concurrency=50,
                  backoff_base=tiny, backoff_cap=tiny)
    try:
        with Sender(bounced, retry_budget=0, **common) as none, Sender(bounced, retry_budget=6, **common) as some, \
                psycopg.connect(db_url, autocommit=True) as c:
            before = c.execute("SELECT clock_timestamp()").fetchone()[0]
            assert none.run_once(target) == 12  # first attempts: never held back
            after = c.execute("SELECT clock_timestamp()").fetchone()[0]
            due = [d for (d,) in c.execute("SELECT next_attempt_at FROM idempotency.outbound WHERE target = %s",
                                           (target,)).fetchall()]
            assert len(due) == 12 and all(before <= d <= after + tiny for d in due), (before, due, after)
            time.sleep(0.05)
            assert none.run_once(target) == 0  # budget 0: no retries, though 12 are due
            assert some.run_once(target) == 12  # budget 6: (6 x 12 first attempts + 10) / 6 >= 12
    finally:
        r.close()
    assert len(r.log) == 24
    query = ("SELECT current_setting('idempotency.send_retry_budget', true), "
             "current_setting('idempotency.send_backoff_cap', true)")
    with psycopg.connect(bounced, autocommit=True, prepare_threshold=None) as b:
        for _ in range(5):  # whichever server connection PgBouncer hands out
            budget, cap = b.execute(query).fetchone()
            assert budget not in ("0.0", "1.0") and cap != "0.001000 seconds", (budget, cap)
