"""The sender demo (tests/sending/README.md's protocol): orders whose charge is sent to a
receiver with an Idempotency-Key made once, in the order's transaction.

    send_demo.py prepare COUNT PREFIX       COUNT orders, each with its send, one transaction each
    send_demo.py work [--until-idle] [--concurrency N]   the worker for $TARGET
    send_demo.py inline COUNT PREFIX        prepare, then deliver right after each COMMIT

Environment: DATABASE_URL (the sender's database), RECEIVER_URL (where to POST), TARGET
(default "receiver"), SEND_LEASE_MS (30000), SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY
(sent as X-Api-Key; default "send-demo")."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from datetime import timedelta

import psycopg

from pg_idempotency.sender import Answer, Attempt, Delivered, Lost, NotYet, Sender, Unknown, prepare

SCOPE = "send-demo"
SCHEMA = ("CREATE TABLE IF NOT EXISTS send_demo_orders (id text PRIMARY KEY, amount int NOT NULL, "
          "payment_key text NOT NULL)")


def say(line: str) -> None:
    print(line, flush=True)


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


def prepare_orders(db: str, target: str, count: int, prefix: str, after_commit=None) -> None:
    with psycopg.connect(db) as conn:
        conn.execute(SCHEMA)
        conn.commit()
        for i in range(1, count + 1):
            order = f"{prefix}-{i}"
            operation = f"{order}:charge"
            with conn.transaction():
                sent = prepare(conn, SCOPE, operation, target, {"amount": i, "currency": "eur"})
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
    if args.command == "prepare":
        prepare_orders(db, target, args.count, args.prefix)
        say(f"prepared {args.count}")
        return 0

    def on_attempt(a: Attempt, answer: Answer) -> None:
        say(f"attempt {a.operation} {a.attempt} {answer.status if answer.status is not None else 'none'}")

    def on_finished(a: Attempt, result) -> None:
        state, status = describe(result)
        say(f"finished {a.operation} {state} {status}")

    sender = Sender(db, urls={target: os.environ["RECEIVER_URL"]},
                    headers={target: {"X-Api-Key": os.environ.get("RECEIVER_API_KEY", "send-demo")}},
                    lease=timedelta(milliseconds=int(os.environ.get("SEND_LEASE_MS", "30000"))),
                    timeout=int(os.environ.get("SEND_TIMEOUT_MS", "10000")) / 1000,
                    concurrency=getattr(args, "concurrency", 4), poll_interval=0.2,
                    on_attempt=on_attempt, on_finished=on_finished)
    with sender:
        if args.command == "inline":
            def deliver(operation: str) -> None:
                state, status = describe(sender.deliver(SCOPE, operation))
                say(f"delivered {operation} {state} {status}")
            prepare_orders(db, target, args.count, args.prefix, after_commit=deliver)
            return 0
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        sender.run(target, stop=stop, until_idle=args.until_idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
