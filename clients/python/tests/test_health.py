"""pg_idempotency.health against real sessions: a connection whose session the server ended
(pg_terminate_backend: the same last message, 57P01, as a fast shutdown) is found dead without
a statement sent; one that got a NOTIFY meanwhile is alive, and psycopg still delivers it;
last_words hears the end of a session that psycopg would have dropped; a COMMIT the server cut
off (57P01) did not commit."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from pg_idempotency.errors import ended_uncommitted, unavailable
from pg_idempotency.health import is_dead, last_words


def terminate(db_url: str, conn: psycopg.Connection) -> None:
    pid = conn.info.backend_pid
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


def test_a_live_idle_connection_is_alive(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert not is_dead(conn)
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("in_transaction", [False, True], ids=["idle", "idle in transaction"])
def test_a_connection_whose_session_ended_is_dead_and_closed(db_url, in_transaction):
    with psycopg.connect(db_url, autocommit=True) as conn:
        if in_transaction:
            conn.execute("BEGIN")
        terminate(db_url, conn)
        assert is_dead(conn)
        assert conn.closed  # so that a pool discards it


def test_a_notify_that_came_meanwhile_leaves_it_alive_and_is_delivered(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn, psycopg.connect(db_url, autocommit=True) as other:
        got: list[str] = []
        conn.add_notify_handler(lambda n: got.append(n.payload))
        conn.execute("LISTEN health_test")
        other.execute("NOTIFY health_test, 'hello'")
        time.sleep(0.2)  # the notification is on conn's socket now
        assert not is_dead(conn)
        assert conn.execute("SELECT 2").fetchone() == (2,)
        assert got == ["hello"]  # psycopg delivers it with the next statement, as without the check


def test_a_statement_after_the_end_failed_without_running_and_last_words_tell(db_url):
    """The end of a session heard between two statements (as a notice) is what tells that the
    next statement never ran, whatever psycopg then raises for it."""
    with psycopg.connect(db_url, autocommit=True) as conn, last_words(conn) as heard:
        conn.execute("BEGIN")
        terminate(db_url, conn)
        time.sleep(0.2)
        conn.pgconn.consume_input()
        conn.pgconn.is_busy()  # what psycopg does between statements: parses what came
        assert heard == ["57P01"]
        with pytest.raises(psycopg.OperationalError) as failed:
            conn.execute("SELECT 1")
        assert unavailable(failed.value)


def test_a_commit_the_server_cut_off_is_57p01_and_did_not_commit(db_url):
    """What the middleware answers 503 for when idem_complete and COMMIT fail: 57P01 came back
    to the string holding the COMMIT, and the row written before it is not there."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS health_rows (note text)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO health_rows VALUES ('cut off')")
        killer = threading.Timer(0.3, terminate, (db_url, conn))
        killer.start()
        try:
            with pytest.raises(psycopg.OperationalError) as failed:
                psycopg.ClientCursor(conn).execute("SELECT pg_sleep(3); COMMIT")
        finally:
            killer.join()
        assert ended_uncommitted(failed.value), failed.value
    with psycopg.connect(db_url) as check:
        assert check.execute("SELECT count(*) FROM health_rows WHERE note = 'cut off'").fetchone() == (0,)
