"""The upgrade 0.5.0 -> 0.6.0 under load (tests/upgrade/run.sh): claims and message
deliveries go on while ALTER EXTENSION idempotency UPDATE runs and while idem_sweep moves the
0.5.0 tables' records into the partitions, and not one key is lost or duplicated.

Workers claim keys from a small pool, in one transaction with their business write (a row
of `ledger` per execution) and the complete, and de-duplicate message ids (a row of
`handled` per first sighting); every answer of a key must be the one stored for it. A
database error (a statement that met the UPDATE's locks or a function made again) rolls the
transaction back and the worker tries again: errors are allowed, a second execution is not.
At the end: every key and message id ran at most once, every key that ran has its completed
record (replayed with its own body), and the tables of 0.5.0 are gone.

    under_load.py --dsn DSN --seconds S --target-version V
Prints "ok ..." / "FAIL ..." lines and exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

import psycopg

SCOPE = "load"
KEYS = [f"k-{i}" for i in range(200)]
MESSAGES = [f"m-{i}" for i in range(200)]

failures: list[str] = []
lock = threading.Lock()
counts = {"claimed": 0, "replay": 0, "in_progress": 0, "seen": 0, "errors": 0}


def note(what: str) -> None:
    with lock:
        counts[what] += 1


def fail(why: str) -> None:
    with lock:
        failures.append(why)


def worker(dsn: str, stop: threading.Event, seed: int) -> None:
    rnd = random.Random(seed)
    conn = None
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True)
            key = rnd.choice(KEYS)
            with conn.transaction():
                row = conn.execute(
                    "SELECT outcome, token, response_body FROM idempotency.idem_claim(%s, %s, 'fp')",
                    (SCOPE, key)).fetchone()
                outcome, token, body = row
                if outcome == "claimed":
                    conn.execute("INSERT INTO ledger (key) VALUES (%s)", (key,))
                    conn.execute("SELECT idempotency.idem_complete(%s, %s, %s, 201, %s)",
                                 (SCOPE, key, token, json.dumps({"key": key})))
                elif outcome == "replay" and body != {"key": key}:
                    fail(f"{key}: replayed {body!r}")
                elif outcome not in ("replay", "in_progress"):
                    fail(f"{key}: answered {outcome}")
            note(outcome)
            message = rnd.choice(MESSAGES)
            with conn.transaction():
                first = conn.execute("SELECT idempotency.idem_seen(%s, %s)", (SCOPE, message)).fetchone()[0]
                if first:
                    conn.execute("INSERT INTO handled (message_id) VALUES (%s)", (message,))
                    note("seen")
        except psycopg.Error:
            note("errors")
            if conn is not None and not conn.closed and conn.info.transaction_status != 0:
                conn.close()
            time.sleep(0.01)
    if conn is not None:
        conn.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--seconds", type=float, default=6)
    p.add_argument("--target-version", required=True)
    args = p.parse_args()

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE ledger (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())")
        admin.execute("CREATE TABLE handled (message_id text NOT NULL)")
        stop = threading.Event()
        threads = [threading.Thread(target=worker, args=(args.dsn, stop, i)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(args.seconds / 3)
        admin.execute(f"ALTER EXTENSION idempotency UPDATE TO '{args.target_version}'")
        updated_at = time.monotonic()
        sweeps = 0
        while time.monotonic() < updated_at + 2 * args.seconds / 3:
            admin.execute("SELECT idempotency.idem_sweep(50)")
            sweeps += 1
            time.sleep(0.05)
        while admin.execute("SELECT to_regclass('idempotency.keys_legacy') IS NOT NULL "
                            "OR to_regclass('idempotency.messages_legacy') IS NOT NULL").fetchone()[0] and sweeps < 500:
            admin.execute("SELECT idempotency.idem_sweep()")
            sweeps += 1
        stop.set()
        for t in threads:
            t.join()

        twice = admin.execute("SELECT key, count(*) FROM ledger GROUP BY key HAVING count(*) > 1").fetchall()
        msg_twice = admin.execute(
            "SELECT message_id, count(*) FROM handled GROUP BY message_id HAVING count(*) > 1").fetchall()
        ran = [r[0] for r in admin.execute("SELECT DISTINCT key FROM ledger")]
        lost = [k for k in ran if admin.execute(
            "SELECT outcome, response_body FROM idempotency.idem_claim(%s, %s, 'fp')", (SCOPE, k)).fetchone()
            != ("replay", {"key": k})]
        legacy = admin.execute("SELECT count(*) FROM pg_class WHERE relname IN ('keys_legacy', 'messages_legacy') "
                               "AND relnamespace = 'idempotency'::regnamespace").fetchone()[0]

    def check(name: str, ok: bool, detail: str = "") -> None:
        print(f"ok   {name}" if ok else f"FAIL {name}: {detail}")
        if not ok:
            failures.append(name)

    check(f"under load ({counts['claimed']} executions, {counts['replay']} replays, {counts['in_progress']} 409s, "
          f"{counts['seen']} first sightings, {counts['errors']} transactions retried after an error, "
          f"{sweeps} sweeps): every answer was the key's own",
          not [f for f in failures], "; ".join(failures[:5]))
    check("under load: enough work ran before, during and after the UPDATE",
          counts["claimed"] >= 20 and counts["replay"] >= 20, json.dumps(counts))
    check("under load: no key ran twice", not twice, repr(twice[:5]))
    check("under load: no message id was handled twice", not msg_twice, repr(msg_twice[:5]))
    check("under load: every key that ran replays its own response (none lost)", not lost, repr(lost[:5]))
    check("under load: the tables of 0.5.0 were emptied and dropped by the sweeps", legacy == 0, f"{legacy} left")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
