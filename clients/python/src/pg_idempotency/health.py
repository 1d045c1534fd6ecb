"""Whether a pooled connection is still open, found without a round trip.

A connection that sat idle in a pool while the database restarted (or failed over, or ended
the session: pg_terminate_backend, idle_session_timeout) is dead, but nothing says so until it
is used: the server sent its last message (FATAL, 57P01 ...) and closed the socket. So an idle
connection whose socket is readable holds either that (dead) or a notice, a NOTIFY or a
parameter change (alive): reading and parsing what is there tells which. No statement is
sent, so a connection found dead can be replaced and the request go on as if nothing happened.
"""

from __future__ import annotations

import select
from contextlib import contextmanager
from typing import Iterator

import psycopg
from psycopg import pq

# How many reads an idle connection gets: the last message, then the end of the stream.
_READS = 3
# What the server's last message to a session says (libpq hands an error that reaches an idle
# connection to the notice handlers).
_LAST_WORDS = frozenset({"FATAL", "PANIC"})


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):  # not bounded by FD_SETSIZE, as select() is
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


@contextmanager
def last_words(conn: psycopg.Connection | psycopg.AsyncConnection) -> Iterator[list[str]]:
    """While the block runs: the SQLSTATE of the server's last message to this connection, if it
    ended the session between two statements (libpq hands an error that reaches a connection
    between statements to the notice handlers, where psycopg would drop it). A statement that
    failed after that was never run: the session had ended before it."""
    heard: list[str] = []

    def hear(diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.severity_nonlocalized in _LAST_WORDS:  # read now: valid during the call only
            heard.append(diagnostic.sqlstate or "")

    conn.add_notice_handler(hear)
    try:
        yield heard
    finally:
        conn.remove_notice_handler(hear)


def is_dead(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when the server has closed, or is closing, this idle connection (nothing is sent to
    find out; one found closing is closed here). Only for a connection nobody is using (between
    statements)."""
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return True
    try:
        if not _readable(pgconn.socket):
            return False
        with last_words(conn) as heard:
            for _ in range(_READS):
                pgconn.consume_input()  # raises once the server has closed its end
                pgconn.is_busy()  # parses what came
                if heard:
                    pgconn.finish()  # closed on this side too, so that its pool discards it
                    return True
                if not _readable(pgconn.socket):
                    break
    except (psycopg.OperationalError, OSError, ValueError):
        return True
    return pgconn.status != pq.ConnStatus.OK
