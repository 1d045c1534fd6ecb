"""The sender demo (tests/sending/README.md's protocol): orders whose charge is sent to a
receiver with an Idempotency-Key made once, in the order's transaction.

    send_demo.py prepare COUNT PREFIX       COUNT orders, each with its send, one transaction each
    send_demo.py work [--until-idle] [--concurrency N]   the worker for $TARGET
    send_demo.py inline COUNT PREFIX        prepare, then deliver right after each COMMIT

Environment: DATABASE_URL (the sender's database), RECEIVER_URL (where to POST), TARGET
(default "receiver"), SEND_LEASE_MS (30000), SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY
(sent as X-Api-Key; default "send-demo"), and the sender's own settings when set:
SEND_RETRY_BUDGET, SEND_BACKOFF_BASE_MS, SEND_BACKOFF_CAP_MS, SEND_GIVE_UP_AFTER_MS.

A sender the package refuses (SEND_TIMEOUT_MS >= SEND_LEASE_MS, a bad setting) prints
`refused MESSAGE` and exits 2. The worker prints `db-error CLASS_OR_SQLSTATE MESSAGE` for
each database error its loop meets and `db-reconnected` when it works again (from the
package's logger, pg_idempotency.sender)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from datetime import timedelta

import psycopg

from pg_idempotency.sender import Answer, Attempt, Delivered, Lost, NotYet, Sender, Unknown, error_code, first_line

SCOPE = "send-demo"
SCHEMA = ("CREATE TABLE IF NOT EXISTS send_demo_orders (id text PRIMARY KEY, amount int NOT NULL, "
          "payment_key text NOT NULL)")


_out = threading.Lock()


def say(line: str) -> None:
    """One whole line (the sender's threads print at once)."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def describe(result) -> tuple[str, str]:
    if isinstance(result, Delivered):
        return "done", str(result.status)
    if isinstance(result, Unknown):
        return "gave_up", "unknown"
    if isinstance(result, NotYet):
        return result.state, "unknown"
    if isinstance(result, Lost):
        return "lost", "unknown"
    raise TypeError(result)


class DbEvents(logging.Handler):
    """The sender's logger, as the protocol's lines."""

    def emit(self, record: logging.LogRecord) -> None:
        error = getattr(record, "db_error", None)
        if error is not None:
            say(f"db-error {error_code(error)} {first_line(error)}")
        elif getattr(record, "db_reconnected", False):
            say("db-reconnected")


def env_ms(name: str) -> timedelta | None:
    value = os.environ.get(name)
    return None if value is None else timedelta(milliseconds=int(value))


def prepare_orders(db: str, sender: Sender, target: str, count: int, prefix: str, after_commit=None) -> None:
    with psycopg.connect(db) as conn:
        conn.execute(SCHEMA)
        conn.commit()
        for i in range(1, count + 1):
            order = f"{prefix}-{i}"
            operation = f"{order}:charge"
            with conn.transaction():
                sent = sender.prepare(conn, SCOPE, operation, target, {"amount": i, "currency": "eur"})
                conn.execute("INSERT INTO send_demo_orders VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                             (order, i, sent.key))
            if after_commit:
                after_commit(operation)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("prepare", "inline"):
        c = sub.add_parser(name)
        c.add_argument("count", type=int)
        c.add_argument("prefix")
    w = sub.add_parser("work")
    w.add_argument("--until-idle", action="store_true")
    w.add_argument("--concurrency", type=int, default=4)
    args = p.parse_args()

    db = os.environ["DATABASE_URL"]
    target = os.environ.get("TARGET", "receiver")

    def on_attempt(a: Attempt, answer: Answer) -> None:
        say(f"attempt {a.operation} {a.attempt} {answer.status if answer.status is not None else 'none'}")

    def on_finished(a: Attempt, result) -> None:
        state, status = describe(result)
        say(f"finished {a.operation} {state} {status}")

    budget = os.environ.get("SEND_RETRY_BUDGET")
    try:
        sender = Sender(db, urls={target: os.environ["RECEIVER_URL"]},
                        headers={target: {"X-Api-Key": os.environ.get("RECEIVER_API_KEY", "send-demo")}},
                        lease=timedelta(milliseconds=int(os.environ.get("SEND_LEASE_MS", "30000"))),
                        timeout=int(os.environ.get("SEND_TIMEOUT_MS", "10000")) / 1000,
                        retry_budget=None if budget is None else float(budget),
                        backoff_base=env_ms("SEND_BACKOFF_BASE_MS"), backoff_cap=env_ms("SEND_BACKOFF_CAP_MS"),
                        give_up_after=env_ms("SEND_GIVE_UP_AFTER_MS"),
                        concurrency=getattr(args, "concurrency", 4), poll_interval=0.2,
                        on_attempt=on_attempt, on_finished=on_finished)
    except ValueError as e:
        say(f"refused {e}")
        return 2
    with sender:
        if args.command == "prepare":
            prepare_orders(db, sender, target, args.count, args.prefix)
            say(f"prepared {args.count}")
            return 0
        if args.command == "inline":
            def deliver(operation: str) -> None:
                state, status = describe(sender.deliver(SCOPE, operation))
                say(f"delivered {operation} {state} {status}")
            prepare_orders(db, sender, target, args.count, args.prefix, after_commit=deliver)
            return 0
        log = logging.getLogger("pg_idempotency.sender")
        log.setLevel(logging.INFO)
        log.addHandler(DbEvents())
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        sender.run(target, stop=stop, until_idle=args.until_idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
