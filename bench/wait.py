#!/usr/bin/python3
"""idem_claim(..., wait => ...): how soon a waiting duplicate answers after the owner's COMMIT,
and what waiting costs in CPU (issue 15; goals: p50 < 10 ms, 50 waiters < 5 % of one core).

Runs against a server with the extension installed (PGHOST / PGPORT / PGUSER from the
environment; the server must run on this machine, for the CPU reading from /proc), in a
database of its own that it creates afresh. Uses Debian's python3-psycopg (/usr/bin/python3).

  bench/wait.py [--rounds R] [--idle S]

Latency: for 1 and for 50 waiters, R rounds each: an owner claims a key and commits; the
waiters call idem_claim(..., wait => '30 seconds') and sleep in the extension's wait (seen
in pg_stat_activity); the owner completes and commits; each waiter's delay is the time from
the owner's COMMIT returning to its own answer arriving (both measured here, one clock).
CPU: 50 waiters wait S seconds on a key nobody changes; the CPU time (utime + stime, from
/proc/PID/stat) their backends used meanwhile, as a share of one core.
"""
import argparse
import statistics
import threading
import time

import psycopg

DB = "idem_bench_wait"


def connect(db=DB, autocommit=True):
    return psycopg.connect(dbname=db, autocommit=autocommit)


def wait_until_waiting(admin, n):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Extension' "
            "AND query LIKE '%%wait =>%%' AND pid <> pg_backend_pid()",
        ).fetchone()[0]
        if got >= n:
            return
        time.sleep(0.002)
    raise RuntimeError(f"only {got} of {n} waiters are waiting")


def one_round(admin, conns, key):
    owner = connect()
    token = owner.execute("SELECT token FROM idempotency.idem_claim('bench', %s, 'fp')", (key,)).fetchone()[0]
    answers = [None] * len(conns)

    def waiter(i, conn):
        outcome = conn.execute(
            "SELECT outcome FROM idempotency.idem_claim('bench', %s, 'fp', wait => '30 seconds')", (key,)
        ).fetchone()[0]
        answers[i] = (time.perf_counter(), outcome)

    threads = [threading.Thread(target=waiter, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    wait_until_waiting(admin, len(conns))
    owner.execute("BEGIN")
    owner.execute("SELECT idempotency.idem_complete('bench', %s, %s, 201)", (key, token))
    sent = time.perf_counter()
    owner.execute("COMMIT")
    committed = time.perf_counter()
    for t in threads:
        t.join()
    owner.close()
    assert all(a[1] == "replay" for a in answers), answers
    return [((a[0] - sent) * 1000, (a[0] - committed) * 1000) for a in answers]


def cpu_ns(pids):
    """Nanoseconds the processes have run on a CPU (/proc/PID/schedstat, first field)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--idle", type=float, default=20.0)
    args = ap.parse_args()
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB}")
        c.execute(f"CREATE DATABASE {DB}")
    admin = connect()
    admin.execute("CREATE EXTENSION idempotency")
    print("Delay from the owner's COMMIT being sent (and, in brackets, from its reply arriving;")
    print("negative: the waiter answered before the owner's client had the reply) to the answer:")
    print("| waiters | rounds | answers | p50 ms | p90 ms | p99 ms | max ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in (1, 50):
        conns = [connect() for _ in range(n)]
        rounds = args.rounds if n == 1 else max(3, args.rounds // 5)
        delays = []
        for r in range(rounds):
            delays += one_round(admin, conns, f"lat-{n}-{r}")
        sent = [d[0] for d in delays]
        ret = [d[1] for d in delays]
        cells = " | ".join(f"{pct(sent, p):.2f} ({pct(ret, p):.2f})" for p in (50, 90, 99))
        print(f"| {n} | {rounds} | {len(delays)} | {cells} | {max(sent):.2f} ({max(ret):.2f}) |")
        for c in conns:
            c.close()

    # CPU of 50 waiting backends.
    owner = connect()
    owner.execute("SELECT idempotency.idem_claim('bench', 'idle', 'fp', lease => '1 hour')")
    conns = [connect() for _ in range(50)]
    pids = [c.info.backend_pid for c in conns]
    threads = [threading.Thread(target=lambda c=c: c.execute(
        f"SELECT outcome FROM idempotency.idem_claim('bench', 'idle', 'fp', wait => '{args.idle + 5} seconds')"))
        for c in conns]
    for t in threads:
        t.start()
    wait_until_waiting(admin, 50)
    t0, c0 = time.monotonic(), cpu_ns(pids)
    time.sleep(args.idle)
    t1, c1 = time.monotonic(), cpu_ns(pids)
    cpu_s = (c1 - c0) / 1e9
    print(f"\n50 waiters for {t1 - t0:.1f} s: {cpu_s * 1000:.1f} ms of CPU in their backends = "
          f"{cpu_s / (t1 - t0) * 100:.2f} % of one core")
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    owner.close()
    admin.close()
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE {DB}")


if __name__ == "__main__":
    main()
