#!/usr/bin/python3
"""Committed-first mode, worked example: a worker that may die, and the completer that
finishes its operation from the last checkpoint.

The operation is a two-step charge against an external payment provider: reserve the
amount, then capture it. Each step is an external call, so the claim is committed on its
own first (other requests with the key get 409 at once), every step is followed by
idem_checkpoint (progress + lease renewal), and the end is one transaction holding the
business row and idem_complete, fenced by the claim's token.

If the worker dies, its lease runs out; the completer loop calls
idem_reclaim_stale(release => false), which takes each such claim over with a new token,
and resumes it from recovery_point / recovery_data instead of from the start.

    PGUSER=postgres /usr/bin/python3 examples/completer.py --self-test --host H --port P [--dbname D]

runs that story against a database (it needs CREATE EXTENSION rights the first time) and
checks it; the last line is "completer: N passed, M failed".
"""

import argparse
import os
import sys
import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

LEASE = "30 seconds"
STEPS = ["reserve", "capture"]       # the external calls, in order; each one is a checkpoint


class FakeProvider:
    """Stands in for the external payment API. Like real ones, it takes an idempotency key
    of its own: a step retried with the same provider key gets the first result back."""

    def __init__(self):
        self.calls = []              # (step, provider key), every call
        self.results = {}            # provider key -> result, one per real execution

    def call(self, step, provider_key, amount):
        self.calls.append((step, provider_key))
        if provider_key not in self.results:
            self.results[provider_key] = f"{step}_{uuid.uuid4().hex[:8]}"
        return self.results[provider_key]


class WorkerDied(Exception):
    """Raised by the self-test's worker to play a process that died mid-operation."""


def perform(conn, scope, key, token, point, data, provider, lease=LEASE, die_after=None):
    """Runs the steps that follow checkpoint `point` (None: from the start), then completes.

    `data` is the recovery_data: the request's amount and the result of every step done.
    Returns the stored response. Raises IK002 (psycopg.DatabaseError) if the claim was
    taken over meanwhile: then this worker must not report success.
    """
    data = dict(data)
    start = STEPS.index(point) + 1 if point in STEPS else 0
    for step in STEPS[start:]:
        data[step] = provider.call(step, f"{scope}/{key}/{step}", data["amount"])
        # Progress and heartbeat in one: a completer resumes after this step, never before it.
        conn.execute("SELECT idempotency.idem_checkpoint(%s, %s, %s, %s, %s, %s::interval)",
                     (scope, key, token, step, Jsonb(data), lease))
        if step == die_after:
            conn.close()
            raise WorkerDied(step)

    response = {"charge": data["capture"], "reservation": data["reserve"], "amount": data["amount"]}
    with conn.transaction():
        conn.execute("INSERT INTO completer_example.charges (scope, key, charge, amount) "
                     "VALUES (%s, %s, %s, %s)", (scope, key, data["capture"], data["amount"]))
        conn.execute("SELECT idempotency.idem_complete(%s, %s, %s, 201, %s)",
                     (scope, key, token, Jsonb(response)))
    return response


def handle_request(conn, scope, key, request, provider, lease=LEASE, die_after=None):
    """POST /charges with an Idempotency-Key, committed-first. `conn` is in autocommit.
    Returns (http status, body)."""
    outcome, token, http_status, body, point, data = conn.execute(
        "SELECT outcome, token, http_status, response_body, recovery_point, recovery_data "
        "FROM idempotency.idem_claim(%s, %s, idempotency.idem_fingerprint(%s), lease => %s::interval)",
        (scope, key, Jsonb(request), lease)).fetchone()
    if outcome == "replay":
        return http_status, body
    if outcome == "in_progress":
        return 409, {"title": "request in progress, retry later"}
    if outcome == "mismatch":
        return 422, {"title": "Idempotency-Key reused with another request"}
    # claimed, or reclaimed: we took over a dead worker's claim and resume after its checkpoint.
    if point is None:
        data = {"amount": request["amount"]}
    return 201, perform(conn, scope, key, token, point, data, provider, lease, die_after)


def completer_pass(conn, provider, scope_prefix, lease=LEASE, max_rows=100):
    """One round of the background completer. Returns what it did, per (scope, key)."""
    done = {}
    rows = conn.execute(
        "SELECT scope, key, token, recovery_point, recovery_data "
        "FROM idempotency.idem_reclaim_stale(%s, release => false, lease => %s::interval)",
        (max_rows, lease)).fetchall()
    for scope, key, token, point, data in rows:
        if not scope.startswith(scope_prefix):
            # idem_reclaim_stale works on every scope. One we cannot resume stays
            # in_progress under our token; when this lease ends, its own completer takes it.
            done[(scope, key)] = "not ours"
            continue
        if point is None:
            # Died before its first checkpoint: we do not even know the request. Release
            # it; the client's retry runs it as new (the provider keys make that safe).
            conn.execute("SELECT idempotency.idem_release(%s, %s, %s)", (scope, key, token))
            done[(scope, key)] = "released"
            continue
        try:
            perform(conn, scope, key, token, point, data, provider, lease)
            done[(scope, key)] = f"completed from {point}"
        except psycopg.DatabaseError as e:
            if e.sqlstate != "IK002":
                raise
            done[(scope, key)] = "taken over by someone else"
    return done


def completer_loop(conninfo, provider, scope_prefix, stop, every=5.0):
    """The background completer: one pass every `every` seconds until `stop` is set."""
    while not stop.wait(every):
        try:
            with psycopg.connect(**conninfo, autocommit=True) as conn:
                for (scope, key), what in completer_pass(conn, provider, scope_prefix).items():
                    print(f"completer: {scope} {key}: {what}", flush=True)
        except psycopg.Error as e:
            print(f"completer: {e}", file=sys.stderr, flush=True)


# ---- self-test --------------------------------------------------------------------------

def self_test(conninfo):
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {len(results)}. {name}{'' if ok else ': ' + str(detail)}",
              flush=True)

    def connect():
        return psycopg.connect(**conninfo, autocommit=True)

    def record(key):
        return admin.execute(
            "SELECT status, token, attempts, recovery_point, recovery_data, response_status, "
            "response_body FROM idempotency.idem_lookup(%s, %s)", (scope, key)).fetchone()

    def wait_for_lease_end(key):
        for _ in range(100):
            if admin.execute("SELECT locked_until < now() FROM idempotency.keys "
                             "WHERE scope = %s AND key = %s", (scope, key)).fetchone()[0]:
                return
            time.sleep(0.1)

    def ledger(key):
        return admin.execute("SELECT count(*) FROM completer_example.charges "
                             "WHERE scope = %s AND key = %s", (scope, key)).fetchone()[0]

    admin = connect()
    admin.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
    admin.execute("CREATE SCHEMA IF NOT EXISTS completer_example")
    admin.execute("CREATE TABLE IF NOT EXISTS completer_example.charges (scope text, key text, "
                  "charge text, amount int)")
    prefix = "completer-example/"
    scope = f"{prefix}{uuid.uuid4()}:POST /charges"
    provider = FakeProvider()
    request = {"amount": 500, "currency": "EUR"}
    lease = "1 second"

    # A worker claims, reserves, checkpoints, and dies before capturing.
    worker = connect()
    try:
        handle_request(worker, scope, "k-1", request, provider, lease, die_after="reserve")
        died = False
    except WorkerDied:
        died = True
    rec = record("k-1")
    check("the worker died after its first checkpoint, leaving an in_progress claim",
          died and rec and rec[0] == "in_progress" and rec[3] == "reserve"
          and rec[4].get("reserve") == provider.results.get(f"{scope}/k-1/reserve"), rec)
    dead_token = rec[1]

    # While its lease runs: retries get 409 and the completer leaves the claim alone.
    client = connect()
    status, _ = handle_request(client, scope, "k-1", request, provider, lease)
    early = completer_pass(admin, provider, prefix, lease)
    check("before the lease ends a retry gets 409 and the completer takes nothing",
          status == 409 and (scope, "k-1") not in early, (status, early))

    # The lease ends; the completer takes the claim over and resumes it.
    wait_for_lease_end("k-1")
    done = completer_pass(admin, provider, prefix, lease)
    rec = record("k-1")
    check("after the lease the completer takes the claim over and completes it",
          done.get((scope, "k-1")) == "completed from reserve" and rec[0] == "completed"
          and rec[2] == 2 and rec[1] != dead_token and rec[5] == 201, (done, rec))

    steps = [step for step, pkey in provider.calls if pkey.startswith(f"{scope}/k-1/")]
    check("it resumed from the checkpoint: reserve ran once (by the worker), capture once",
          steps == ["reserve", "capture"], steps)
    check("the operation finished exactly once: one charge row, the stored response is it",
          ledger("k-1") == 1 and rec[6]["reservation"] == provider.results[f"{scope}/k-1/reserve"]
          and rec[6]["charge"] == provider.results[f"{scope}/k-1/capture"], (ledger("k-1"), rec[6]))

    # The dead worker's token no longer owns the record: its late completion is refused.
    try:
        admin.execute("SELECT idempotency.idem_complete(%s, %s, %s, 201, '{}')",
                      (scope, "k-1", dead_token))
        state = "accepted"
    except psycopg.DatabaseError as e:
        state = e.sqlstate
    check("the dead worker's token is fenced off (IK002)", state == "IK002", state)

    calls = len(provider.calls)
    status, body = handle_request(client, scope, "k-1", request, provider, lease)
    check("the client's retry gets the stored response and runs nothing",
          (status, body) == (201, rec[6]) and len(provider.calls) == calls, (status, body))

    # A worker that dies right after claiming, before any checkpoint: nothing is known of
    # its request, so the completer releases the claim and the retry runs it as new.
    worker = connect()
    worker.execute("SELECT idempotency.idem_claim(%s, 'k-2', idempotency.idem_fingerprint(%s), "
                   "lease => %s::interval)", (scope, Jsonb(request), lease))
    worker.close()
    wait_for_lease_end("k-2")
    done = completer_pass(admin, provider, prefix, lease)
    status, body = handle_request(client, scope, "k-2", request, provider, lease)
    check("a claim dead before its first checkpoint is released; the retry runs it once",
          done.get((scope, "k-2")) == "released" and status == 201 and ledger("k-2") == 1, (done, status))

    # The loop form, in a thread: a worker dies after capturing; the loop completes it.
    worker = connect()
    try:
        handle_request(worker, scope, "k-3", request, provider, lease, die_after="capture")
    except WorkerDied:
        pass
    stop = threading.Event()
    loop = threading.Thread(target=completer_loop, args=(conninfo, provider, prefix, stop, 0.5))
    loop.start()
    for _ in range(100):
        rec = record("k-3")
        if rec and rec[0] == "completed":
            break
        time.sleep(0.1)
    stop.set()
    loop.join()
    steps = [step for step, pkey in provider.calls if pkey.startswith(f"{scope}/k-3/")]
    check("the completer loop finishes a worker that died after its last step, running no step again",
          rec and rec[0] == "completed" and steps == ["reserve", "capture"] and ledger("k-3") == 1,
          (rec, steps))

    left = completer_pass(admin, provider, prefix, lease)
    left = {k: v for k, v in left.items() if k[0] == scope}
    stale = admin.execute("SELECT count(*) FROM idempotency.keys WHERE scope = %s "
                          "AND status = 'in_progress'", (scope,)).fetchone()[0]
    check("nothing of ours is left in_progress", not left and stale == 0, (left, stale))

    admin.execute("DELETE FROM completer_example.charges WHERE scope = %s", (scope,))
    passed = sum(results)
    failed = len(results) - passed
    print(f"completer: {passed} passed, {failed} failed")
    return failed


def main():
    p = argparse.ArgumentParser(description="Committed-first worker and completer, with a self-test.")
    p.add_argument("--self-test", action="store_true",
                   help="run the worked example against the database and check it")
    p.add_argument("--host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    p.add_argument("--dbname", default=os.environ.get("PGDATABASE", "postgres"))
    args = p.parse_args()
    if not args.self_test:
        p.print_help()
        sys.exit(2)
    conninfo = dict(host=args.host, port=args.port, dbname=args.dbname,
                    user=os.environ.get("PGUSER", "postgres"), application_name="completer-example")
    try:
        failed = self_test(conninfo)
    except Exception as e:
        print(f"completer: self-test aborted: {type(e).__name__}: {e}")
        print("completer: 0 passed, 1 failed")
        failed = 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
