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
the owner's COMMIT being sent (and from its reply arriving) to its own answer arriving, both
read here on one clock. All connections are asynchronous on one event loop: a thread per
waiter would add the interpreter's thread switches (GIL hand-offs of up to 5 ms) to the
figures it measures.
CPU: 50 waiters wait S seconds on a key nobody changes; the CPU time (utime + stime, from
/proc/PID/stat) their backends used meanwhile, as a share of one core.
"""
import argparse
import asyncio
import time

import psycopg

DB = "idem_bench_wait"


async def connect(db=DB):
    return await psycopg.AsyncConnection.connect(dbname=db, autocommit=True)


async def one(conn, sql, args=()):
    return await (await conn.execute(sql, args)).fetchone()


async def wait_until_waiting(admin, n):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (got,) = await one(
            admin,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Extension' "
            "AND query LIKE '%%wait =>%%' AND pid <> pg_backend_pid()",
        )
        if got >= n:
            return
        await asyncio.sleep(0.002)
    raise RuntimeError(f"only {got} of {n} waiters are waiting")


async def claim_waiting(conn, key, wait):
    (outcome,) = await one(
        conn, f"SELECT outcome FROM idempotency.idem_claim('bench', %s, 'fp', wait => '{wait}')", (key,)
    )
    return time.perf_counter(), outcome


async def one_round(admin, conns, key):
    owner = await connect()
    (token,) = await one(owner, "SELECT token FROM idempotency.idem_claim('bench', %s, 'fp')", (key,))
    waiters = [asyncio.create_task(claim_waiting(c, key, "30 seconds")) for c in conns]
    await wait_until_waiting(admin, len(conns))
    await owner.execute("BEGIN")
    await owner.execute("SELECT idempotency.idem_complete('bench', %s, %s, 201)", (key, token))
    sent = time.perf_counter()
    await owner.execute("COMMIT")
    committed = time.perf_counter()
    answers = await asyncio.gather(*waiters)
    await owner.close()
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


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--idle", type=float, default=20.0)
    args = ap.parse_args()
    async with await connect("postgres") as c:
        await c.execute(f"DROP DATABASE IF EXISTS {DB}")
        await c.execute(f"CREATE DATABASE {DB}")
    admin = await connect()
    await admin.execute("CREATE EXTENSION idempotency")
    print("Delay from the owner's COMMIT being sent (and, in brackets, from its reply arriving;")
    print("negative: the waiter answered before the owner's client had the reply) to the answer:")
    print("| waiters | rounds | answers | p50 ms | p90 ms | p99 ms | max ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in (1, 50):
        conns = [await connect() for _ in range(n)]
        rounds = args.rounds if n == 1 else max(3, args.rounds // 5)
        delays = []
        for r in range(rounds):
            delays += await one_round(admin, conns, f"lat-{n}-{r}")
        sent = [d[0] for d in delays]
        ret = [d[1] for d in delays]
        cells = " | ".join(f"{pct(sent, p):.2f} ({pct(ret, p):.2f})" for p in (50, 90, 99))
        print(f"| {n} | {rounds} | {len(delays)} | {cells} | {max(sent):.2f} ({max(ret):.2f}) |")
        for c in conns:
            await c.close()

    # CPU of 50 waiting backends.
    owner = await connect()
    await owner.execute("SELECT idempotency.idem_claim('bench', 'idle', 'fp', lease => '1 hour')")
    conns = [await connect() for _ in range(50)]
    pids = [c.info.backend_pid for c in conns]
    waiters = [asyncio.create_task(claim_waiting(c, "idle", f"{args.idle + 5} seconds")) for c in conns]
    await wait_until_waiting(admin, 50)
    t0, c0 = time.monotonic(), cpu_ns(pids)
    await asyncio.sleep(args.idle)
    t1, c1 = time.monotonic(), cpu_ns(pids)
    cpu_s = (c1 - c0) / 1e9
    print(f"\n50 waiters for {t1 - t0:.1f} s: {cpu_s * 1000:.1f} ms of CPU in their backends = "
          f"{cpu_s / (t1 - t0) * 100:.2f} % of one core")
    await asyncio.gather(*waiters)
    for c in conns:
        await c.close()
    await owner.close()
    await admin.close()
    async with await connect("postgres") as c:
        await c.execute(f"DROP DATABASE {DB}")


if __name__ == "__main__":
    asyncio.run(main())
