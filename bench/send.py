"""The sending side against the outbox teams write by hand (bench/send.sh starts the cluster
and runs this; see there for the options). Every figure alternates the implementations on the
same cluster, round after round, and reports the median.

  ours      the extension through the Python package: idem_send in the business transaction;
            senders are pg_idempotency.sender.Sender (idem_send_next, the request,
            idem_send_result), one send per idem_send_next; the worker LISTENs and polls
            every second
  ours4     the same with the packages' default concurrency, 4: up to 4 sends per
            idem_send_next, their requests at once (a thread each)
  hand      the hand-written outbox: an INSERT into bench_outbox in the business transaction;
            a sender runs BEGIN; SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1; the request;
            UPDATE; COMMIT; its worker sleeps a fixed second when nothing is due
  handlease the hand-written outbox with a lease, as ours keeps none open during a request:
            UPDATE ... SET state = 'sending' WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED
            LIMIT 1) RETURNING; the request; UPDATE ... SET state = 'done' (autocommit)
  portable  ours against the portable edition, in a second database: idem_send_next and
            idem_send_result in PL/pgSQL (the native extension's are the library's since 0.6.0)

Both send through the same keep-alive HTTP connection per sender process to a local receiver
(a process of its own) that answers 201 at once and logs when each key arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

from pg_idempotency.sender import Answer, Attempt, Sender, key_header

TARGET = "bench-receiver"
SCOPE = "bench"

HAND_SCHEMA = """
DROP TABLE IF EXISTS bench_outbox;
CREATE TABLE bench_outbox (
    id bigserial PRIMARY KEY, key text NOT NULL, request jsonb, state text NOT NULL DEFAULT 'pending',
    attempts int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
    response_status int, response_body text, finished_at timestamptz);
CREATE INDEX ON bench_outbox (next_attempt_at) WHERE state = 'pending';
DROP TABLE IF EXISTS bench_orders;
CREATE TABLE bench_orders (id text PRIMARY KEY, amount int NOT NULL, payment_key text NOT NULL);
"""


# --- the receiver: a process of its own ----------------------------------------------------

def receiver_main(port: int, log_path: str, ready) -> None:
    arrivals: list[tuple[str, float]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                now = time.time()
                length, key = 0, ""
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    elif name.lower() == "idempotency-key":
                        key = value.strip()
                if length:
                    await reader.readexactly(length)
                arrivals.append((key, now))
                writer.write(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=256)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        ready.set()
        async with server:
            await stop.wait()
        Path(log_path).write_text(json.dumps(arrivals))

    asyncio.run(serve())


class Receiver:
    def __init__(self, port: int, out: Path):
        self.port, self.log = port, out / "arrivals.json"
        self.url = f"http://127.0.0.1:{port}/charges"

    def __enter__(self) -> Receiver:
        ready = mp.Event()
        self.proc = mp.Process(target=receiver_main, args=(self.port, str(self.log), ready))
        self.proc.start()
        if not ready.wait(10):
            raise RuntimeError("the receiver did not start")
        return self

    def arrivals(self) -> dict[str, float]:
        """Stops the receiver; the first arrival of each key."""
        os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.join(10)
        first: dict[str, float] = {}
        for key, t in json.loads(self.log.read_text()):
            first.setdefault(key, t)
        return first

    def __exit__(self, *exc) -> None:
        if self.proc.is_alive():
            self.proc.kill()


class Http:
    """One keep-alive connection to the receiver, per sender process."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def post(self, key: str, request) -> tuple[int, str]:
        body = json.dumps(request).encode()
        self.conn.request("POST", "/charges", body, {"Idempotency-Key": key_header(key),
                                                      "Content-Type": "application/json"})
        r = self.conn.getresponse()
        return r.status, r.read().decode()


# --- senders -------------------------------------------------------------------------------

def ours_sender(dsn: str, port: int, concurrency: int = 1) -> Sender:
    local = threading.local()

    def send(a: Attempt) -> Answer:
        if not hasattr(local, "http"):
            local.http = Http(port)
        status, body = local.http.post(a.key, a.request)
        return Answer(status, {}, body)

    return Sender(dsn, send=send, concurrency=concurrency, poll_interval=1.0)


def drain_ours(dsn: str, port: int, start, done, concurrency: int = 1) -> None:
    with ours_sender(dsn, port, concurrency) as s:
        start.wait()
        n = 0
        while taken := s.run_once(TARGET):
            n += taken
        done.put(n)


HAND_TAKE = """SELECT id, key, request FROM bench_outbox WHERE state = 'pending' AND next_attempt_at <= now()
ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED"""
HAND_DONE = """UPDATE bench_outbox SET state = 'done', attempts = attempts + 1, response_status = %s,
response_body = %s, finished_at = now() WHERE id = %s"""


def hand_once(conn: psycopg.Connection, http_: Http) -> bool:
    with conn.transaction():
        row = conn.execute(HAND_TAKE).fetchone()
        if row is None:
            return False
        status, body = http_.post(row[1], row[2])
        conn.execute(HAND_DONE, (status, body, row[0]))
    return True


HAND_LEASE = """UPDATE bench_outbox SET state = 'sending', attempts = attempts + 1,
next_attempt_at = now() + interval '30 seconds' WHERE id = (SELECT id FROM bench_outbox
WHERE state = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, key, request"""
HAND_LEASE_DONE = """UPDATE bench_outbox SET state = 'done', response_status = %s, response_body = %s,
finished_at = now() WHERE id = %s AND state = 'sending'"""


def lease_once(conn: psycopg.Connection, http_: Http) -> bool:
    """The hand-written outbox with a lease: no transaction open during the request."""
    row = conn.execute(HAND_LEASE).fetchone()
    if row is None:
        return False
    status, body = http_.post(row[1], row[2])
    conn.execute(HAND_LEASE_DONE, (status, body, row[0]))
    return True


def drain_hand(dsn: str, port: int, start, done, once=hand_once) -> None:
    http_ = Http(port)
    with psycopg.connect(dsn, autocommit=once is lease_once) as conn:
        start.wait()
        n = 0
        while once(conn, http_):
            n += 1
        done.put(n)


def worker_ours(dsn: str, port: int, stop) -> None:
    with ours_sender(dsn, port) as s:
        stopping = threading.Event()
        threading.Thread(target=lambda: (stop.wait(), stopping.set()), daemon=True).start()
        s.run(TARGET, stop=stopping)


def worker_hand(dsn: str, port: int, stop) -> None:
    http_ = Http(port)
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            if not hand_once(conn, http_):
                stop.wait(1.0)


# --- the business transaction --------------------------------------------------------------

def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("TRUNCATE idempotency.outbound, idempotency.outbound_budget, bench_outbox, bench_orders")


def prepare_many(dsn: str, impl: str, n: int) -> None:
    """N sends due at once, written in one statement (the throughput run sends, not prepares)."""
    with psycopg.connect(dsn) as c:
        if impl.startswith("hand"):
            c.execute("INSERT INTO bench_outbox (key, request) SELECT gen_random_uuid()::text, "
                      "jsonb_build_object('amount', i) FROM generate_series(1, %s) i", (n,))
        else:
            c.execute("SELECT count(*) FROM generate_series(1, %s) i, LATERAL idempotency.idem_send("
                      "%s, 'order-' || i || ':charge', %s, jsonb_build_object('amount', i)) s",
                      (n, SCOPE, TARGET))
        c.commit()


def business(conn: psycopg.Connection, impl: str, i: int) -> tuple[str, str, float]:
    """One order and its send in one transaction; (operation, key, when COMMIT returned)."""
    order, request = f"order-{i}", {"order": f"order-{i}", "amount": i}
    operation = f"{order}:charge"
    with conn.transaction():
        if impl == "hand":
            key = conn.execute("INSERT INTO bench_outbox (key, request) VALUES (gen_random_uuid()::text, %s) "
                               "RETURNING key", (json.dumps(request),)).fetchone()[0]
        else:
            key = conn.execute("SELECT key FROM idempotency.idem_send(%s, %s, %s, %s)",
                               (SCOPE, operation, TARGET, json.dumps(request))).fetchone()[0]
        conn.execute("INSERT INTO bench_orders VALUES (%s, %s, %s)", (order, i, key))
    return operation, key, time.time()


# --- the measurements ----------------------------------------------------------------------

def throughput(dsn: str, impl: str, senders: int, n: int, port: int, out: Path) -> float:
    """Sends per second: N due sends, S sender processes, until none is left."""
    reset(dsn)
    prepare_many(dsn, impl, n)
    with Receiver(port, out) as r:
        start, done = mp.Event(), mp.Queue()
        if impl in ("hand", "handlease"):
            fn, args = drain_hand, (dsn, port, start, done, lease_once if impl == "handlease" else hand_once)
        else:
            fn, args = drain_ours, (dsn, port, start, done, 4 if impl == "ours4" else 1)
        procs = [mp.Process(target=fn, args=args) for _ in range(senders)]
        for p in procs:
            p.start()
        time.sleep(0.5)  # every sender connected
        t0 = time.perf_counter()
        start.set()
        sent = sum(done.get(timeout=600) for _ in procs)
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join()
        got = r.arrivals()
    if sent != n or len(got) != n:
        raise RuntimeError(f"{impl}: {sent} sent, {len(got)} keys arrived, {n} expected")
    return n / elapsed


def delays(dsn: str, impl: str, n: int, rate: float, port: int, out: Path) -> list[float]:
    """Milliseconds from the business COMMIT to the request's arrival, N sends at RATE per
    second; impl 'inline' delivers right after each COMMIT, the others through a worker."""
    reset(dsn)
    committed: dict[str, float] = {}
    with Receiver(port, out) as r:
        stop = mp.Event()
        worker = None
        if impl != "inline":
            worker = mp.Process(target=worker_hand if impl == "hand" else worker_ours, args=(dsn, port, stop))
            worker.start()
            time.sleep(1.5)  # listening, idle
        inline = ours_sender(dsn, port) if impl == "inline" else None
        with psycopg.connect(dsn) as conn:
            t_next = time.perf_counter()
            for i in range(1, n + 1):
                operation, key, t = business(conn, "hand" if impl == "hand" else "ours", i)
                committed[key_header(key)] = t
                if inline:
                    inline.deliver(SCOPE, operation)
                t_next += 1 / rate
                time.sleep(max(0.0, t_next - time.perf_counter()))
        deadline = time.time() + 30
        while time.time() < deadline and not all_sent(dsn, impl):
            time.sleep(0.1)
        stop.set()
        if worker:
            worker.join(15)
        if inline:
            inline.close()
        got = r.arrivals()
    missing = set(committed) - set(got)
    if missing:
        raise RuntimeError(f"{impl}: {len(missing)} sends never arrived")
    return [(got[k] - t) * 1000 for k, t in committed.items()]


def all_sent(dsn: str, impl: str) -> bool:
    table = "bench_outbox" if impl == "hand" else "idempotency.outbound"
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(f"SELECT NOT EXISTS (SELECT FROM {table} WHERE state <> 'done')").fetchone()[0]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--dsn", required=True)
    a.add_argument("--dsn-portable", required=True)
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--sends", type=int, default=4000)
    a.add_argument("--senders", default="1 16")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--latency-sends", type=int, default=300)
    a.add_argument("--rate", type=float, default=50.0)
    args = a.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for dsn in (args.dsn, args.dsn_portable):
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(HAND_SCHEMA)

    rows: list[str] = []
    tsv = open(args.out / "runs.tsv", "w")
    tsv.write("measure\timpl\tsenders\tround\tvalue\n")

    def note(measure: str, impl: str, senders: int, rnd: int, value: float) -> None:
        tsv.write(f"{measure}\t{impl}\t{senders}\t{rnd}\t{value:.3f}\n")
        tsv.flush()

    rates: dict[tuple[str, int], list[float]] = {}
    for senders in [int(s) for s in args.senders.split()]:
        impls = ["ours", "hand", "ours4", "handlease", "portable"]
        for rnd in range(1, args.rounds + 1):
            for impl in impls:
                dsn = args.dsn_portable if impl == "portable" else args.dsn
                v = throughput(dsn, impl, senders, args.sends, args.port, args.out)
                rates.setdefault((impl, senders), []).append(v)
                note("sends_per_s", impl, senders, rnd, v)
                print(f"  round {rnd}, {senders:2d} senders, {impl:8s}: {v:8.0f} sends/s", flush=True)
        med = {i: statistics.median(rates[(i, senders)]) for i in impls}
        plural = "s" if senders > 1 else ""
        rows.append(f"| sends/s, {senders} sender{plural} | {med['ours']:.0f} | {med['hand']:.0f} | "
                    f"**{med['ours'] / med['hand']:.2f}x** (goal >= 1.0x) |")
        rows.append(f"| sends/s, {senders} sender{plural}, 4 per idem_send_next (the packages' default) | "
                    f"{med['ours4']:.0f} | {med['hand']:.0f} | **{med['ours4'] / med['hand']:.2f}x** |")
        rows.append(f"| sends/s, {senders} sender{plural}, against the hand-written outbox with a lease "
                    f"(two transactions, none open during the request) | {med['ours']:.0f} | {med['handlease']:.0f} | "
                    f"**{med['ours'] / med['handlease']:.2f}x** |")
        rows.append(f"| sends/s, {senders} sender{plural}, 4 per idem_send_next, against the hand-written outbox "
                    f"with a lease | {med['ours4']:.0f} | {med['handlease']:.0f} | "
                    f"**{med['ours4'] / med['handlease']:.2f}x** |")
        rows.append(f"| sends/s, {senders} sender{plural}, the native edition against the portable one "
                    f"(PL/pgSQL) | {med['ours']:.0f} | {med['portable']:.0f} (portable) | "
                    f"{med['ours'] / med['portable']:.2f}x |")

    lat: dict[str, list[float]] = {}
    for rnd in range(1, args.rounds + 1):
        for impl in ("ours", "hand", "inline"):
            d = delays(args.dsn, impl, args.latency_sends, args.rate, args.port, args.out)
            lat.setdefault(impl, []).extend(d)
            note("delay_p50_ms", impl, 1, rnd, pct(d, 50))
            note("delay_p99_ms", impl, 1, rnd, pct(d, 99))
            print(f"  round {rnd}, delay {impl:6s}: p50 {pct(d, 50):7.2f} ms, p99 {pct(d, 99):7.2f} ms", flush=True)
    for impl, label in (("ours", "through a worker (LISTEN)"), ("inline", "inline (deliver after COMMIT)"),
                        ("hand", "hand-written worker (1 s sleep)")):
        d = lat[impl]
        rows.append(f"| COMMIT to request, {label}: p50 / p99 ms | {pct(d, 50):.2f} / {pct(d, 99):.2f} | | "
                    + ("goal p50 < 5 ms |" if impl == "ours" else "|"))
    tsv.close()
    table = "\n".join(["| measure | ours | hand-written / other | ratio |", "| --- | --- | --- | --- |", *rows])
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    mp.set_start_method("fork")
    sys.exit(main())
