#!/usr/bin/python3
"""The idempotency extension from Python (psycopg 3).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres /usr/bin/python3 example.py

Runs, and checks, one claim / business write / complete / replay / mismatch cycle and a
message consumer's idem_seen. The database needs `CREATE EXTENSION idempotency`. The last
line is "python: N passed, M failed".
"""

import os
import sys
import uuid

import psycopg
from psycopg.types.json import Jsonb

SCOPE = "acct_42:POST /orders"
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))


def create_order(conn, key, body):
    """The usual way: claim, business write and stored response in one transaction.
    Returns (outcome, http status, response body)."""
    with conn.transaction():
        outcome, token, http_status, stored_body = conn.execute(
            "SELECT outcome, token, http_status, response_body"
            " FROM idempotency.idem_claim(%s, %s, idempotency.idem_fingerprint(%s))",
            (SCOPE, key, Jsonb(body))).fetchone()
        if outcome not in ("claimed", "reclaimed"):
            return outcome, http_status, stored_body  # replay: 201 + stored body; in_progress 409; mismatch 422
        order_id = conn.execute(
            "INSERT INTO example_orders (item, qty) VALUES (%s, %s) RETURNING id",
            (body["item"], body["qty"])).fetchone()[0]
        response = {"order_id": order_id, "item": body["item"], "qty": body["qty"]}
        conn.execute("SELECT idempotency.idem_complete(%s, %s, %s, 201, %s, %s)",
                     (SCOPE, key, token, Jsonb(response), Jsonb({"Location": f"/orders/{order_id}"})))
        return outcome, 201, response


def consume(conn, message_id, body):
    """An at-least-once consumer: the de-duplication and the work commit together."""
    with conn.transaction():
        first_time = conn.execute("SELECT idempotency.idem_seen('orders-consumer', %s)",
                                  (message_id,)).fetchone()[0]
        if first_time:
            conn.execute("INSERT INTO example_orders (item, qty) VALUES (%s, %s)", (body["item"], body["qty"]))
        return first_time


def main():
    url = os.environ.get("DATABASE_URL")
    if not url:
        sys.exit("set DATABASE_URL, e.g. postgresql://postgres@127.0.0.1:5432/postgres")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, item text, qty int)")
        key = f"py-{uuid.uuid4()}"  # made once per business operation, outside any retry loop
        body = {"item": "book", "qty": 2}

        outcome, status, first = create_order(conn, key, body)
        check("claim: claimed, the order is written, 201", outcome == "claimed" and status == 201, outcome)

        outcome, status, again = create_order(conn, key, body)
        check("same key again: replay of the stored 201 and body",
              outcome == "replay" and status == 201 and again == first, f"{outcome} {status} {again}")

        outcome, status, _ = create_order(conn, key, {"item": "book", "qty": 3})
        check("same key, another body: mismatch, 422", outcome == "mismatch" and status == 422, outcome)

        orders = conn.execute("SELECT count(*) FROM example_orders WHERE id = %s", (first["order_id"],)).fetchone()[0]
        check("one order written", orders == 1, orders)

        message_id = f"msg-{uuid.uuid4()}"
        check("idem_seen, first delivery: true", consume(conn, message_id, body) is True)
        check("idem_seen, redelivery: false", consume(conn, message_id, body) is False)

    print(f"python: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
