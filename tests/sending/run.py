"""The sending suite's driver (tests/sending/README.md); run by tests/sending/run.sh, which
starts the cluster with the databases send_sender and send_receiver.

A real receiver (clients/python/demo/run-asgi: POST /charges, de-duplicated with the
extension, one row of `charges` per request that ran: the side effect) behind a fault proxy
run here (it logs the Idempotency-Key of every request and answers or fails as told), and
the send demo program of each language (tests/sending/senders/LANG.json) as real processes.
Each scenario uses its own tenant (X-Api-Key), so its side effects are counted apart. The
scenarios db_faults and settings use a second cluster (run.sh's `send-faults` one, database
send_faults) as the sender's database: db_faults restarts it under the worker, and settings
needs a database without the suite's ALTER DATABASE defaults.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
SENDERS = Path(__file__).resolve().parent / "senders"
SCOPE = "send-demo"
LEASE_MS = 1500
TIMEOUT_MS = 1000
# The scenarios a language runs unless its senders/LANG.json lists its own ("scenarios").
DEFAULT_SCENARIOS = ["happy", "kills", "faults", "give_up"]

passed = failed = skipped = 0


def check(name: str, ok: bool, detail: str = "") -> bool:
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}", flush=True)
    else:
        failed += 1
        print(f"FAIL {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def skip(name: str, why: str) -> None:
    global skipped
    skipped += 1
    print(f"skip {name}: {why}", flush=True)


def wait_for(what, timeout: float = 30.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = what()
        if value:
            return value
        time.sleep(step)
    return what()


# --- the fault proxy ---------------------------------------------------------------------------

class Proxy:
    """An HTTP proxy in front of the receiver. `plan` is a list of modes used one per request
    (then `mode`): pass, 503, 409, 422, 429:N (Retry-After N), drop (forward, then close without
    an answer), hold (forward, then wait for `release` before answering), delay:MS (forward
    with X-Fault-Delay-Ms: the receiver works that long), trickle:MS (forward, then answer
    slowly: the headers at once, the body a byte every MS ms, until the sender closes the
    connection). `down()` / `up()` close and reopen its port (connection refused meanwhile).

    Each request's log entry: `t` (it arrived: time.monotonic()), `wall` (time.time()),
    `key`, `mode`, `status` (the receiver's, when forwarded), `end` (the exchange ended: the
    answer written, the connection dropped, or the sender closed its connection) and, for
    trickle, `closed_by_sender` (the sender closed the connection before the whole answer)."""

    def __init__(self, port: int, upstream: int):
        self.port, self.upstream = port, upstream
        self.mode = "pass"
        self.plan: list[str] = []
        self.log: list[dict] = []
        self.release = threading.Event()
        self.held = threading.Event()
        self.lock = threading.Lock()
        self.server = None
        self.up()

    def reset(self, mode="pass", plan=()):
        with self.lock:
            self.mode, self.plan, self.log = mode, list(plan), []
        self.release.clear()
        self.held.clear()

    def next_mode(self) -> str:
        with self.lock:
            return self.plan.pop(0) if self.plan else self.mode

    def up(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                mode = proxy.next_mode()
                entry = {"t": time.monotonic(), "wall": time.time(), "key": self.headers.get("Idempotency-Key"),
                         "mode": mode, "body": body}
                with proxy.lock:
                    proxy.log.append(entry)
                try:
                    self.serve(mode, body, entry)
                finally:
                    entry["end"] = time.monotonic()

            def serve(self, mode, body, entry):
                if mode in ("503", "422", "409") or mode.startswith("429"):
                    status = int(mode[:3])
                    headers = {"Retry-After": mode.split(":")[1]} if ":" in mode else {}
                    return self.answer(status, headers, b'{"proxy": true}')
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                if mode.startswith("delay:"):
                    headers["X-Fault-Delay-Ms"] = mode.split(":")[1]
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=30)
                    conn.request("POST", self.path, body, headers)
                    r = conn.getresponse()
                    answer, status = r.read(), r.status
                    kept = ("content-type", "location", "retry-after")
                    rheaders = {k: v for k, v in r.getheaders() if k.lower() in kept}
                    conn.close()
                except OSError:
                    return self.answer(502, {}, b"")
                entry["status"] = status
                if mode == "drop":
                    self.close_connection = True
                    return
                if mode == "hold":
                    proxy.held.set()
                    proxy.release.wait(60)
                if mode.startswith("trickle:"):
                    return self.trickle(status, rheaders, answer, int(mode.split(":")[1]) / 1000, entry)
                self.answer(status, rheaders, answer)

            def trickle(self, status, headers, body, every, entry):
                """The headers at once, then the body a byte every `every` seconds (no socket
                read of the sender waits longer than that), until the sender closes."""
                entry["closed_by_sender"], entry["answer"] = False, body
                self.close_connection = True
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for i in range(len(body)):
                        self.wfile.write(body[i:i + 1])
                        readable, _, _ = select.select([self.connection], [], [], every)
                        if readable and not self.connection.recv(1, socket.MSG_PEEK):
                            entry["closed_by_sender"] = True
                            return
                except OSError:  # reset by the sender
                    entry["closed_by_sender"] = True

            def answer(self, status, headers, body):
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            # Senders open many connections at once (four workers of four): with the default
            # backlog of 5 a busy machine drops SYNs, and a resent one comes a second later.
            request_queue_size = 128

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()

    def keys(self) -> list[str]:
        return [e["key"] for e in self.log]


# --- a sender program ----------------------------------------------------------------------------

class Lang:
    def __init__(self, name: str, spec: dict, env: dict):
        self.name, self.run_prefix = name, [str(ROOT / p) if "/" in p else p for p in spec["run"]]
        # A target per language: the retry budget (per target, over a minute) one language's
        # scenarios spend does not hold back the next language's retries.
        self.env = {**env, "TARGET": f"receiver-{name}"}
        self.scenarios = list(spec.get("scenarios", DEFAULT_SCENARIOS))

    def start(self, *args, tenant: str, **env) -> subprocess.Popen:
        e = {**os.environ, **self.env, "RECEIVER_API_KEY": tenant, **env}
        return subprocess.Popen(self.run_prefix + list(args), env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT)

    def run(self, *args, tenant: str, timeout: float = 120, **env) -> tuple[int, list[str], str]:
        p = self.start(*args, tenant=tenant, **env)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return -1, out.splitlines(), err + "\n(timed out)"
        return p.returncode, out.splitlines(), err


class Watched:
    """A running send demo whose output lines are collected as they come."""

    def __init__(self, p: subprocess.Popen):
        self.p, self.lines, self.err = p, [], []
        for stream, into in ((p.stdout, self.lines), (p.stderr, self.err)):
            threading.Thread(target=lambda s=stream, i=into: i.extend(line.rstrip("\n") for line in s),
                             daemon=True).start()

    def count(self, prefix: str) -> int:
        return sum(1 for line in list(self.lines) if line.startswith(prefix))


class World:
    def __init__(self, args):
        self.faults_db = f"postgresql://postgres@127.0.0.1:{args.faults_pg_port}/send_faults"
        self.faults_dir, self.pg_bin = args.faults_pg_dir, args.pg_bin
        self.sender_db = f"postgresql://postgres@127.0.0.1:{args.pg_port}/send_sender"
        self.receiver_db = f"postgresql://postgres@127.0.0.1:{args.pg_port}/send_receiver"
        receiver_port, proxy_port = args.first_port, args.first_port + 1
        with psycopg.connect(self.receiver_db, autocommit=True) as c:
            c.execute("ALTER DATABASE send_receiver SET idempotency.tombstone_ttl = '1 hour'")
        with psycopg.connect(self.sender_db, autocommit=True) as c:
            c.execute("ALTER DATABASE send_sender SET idempotency.send_backoff_base = '50ms'")
            c.execute("ALTER DATABASE send_sender SET idempotency.send_backoff_cap = '300ms'")
        (ROOT / "target" / "test-logs").mkdir(parents=True, exist_ok=True)
        log = open(ROOT / "target" / "test-logs" / "sending-receiver.log", "w")
        self.receiver = subprocess.Popen(
            [str(ROOT / "clients/python/demo/run-asgi"), "--database-url", self.receiver_db,
             "--listen", f"127.0.0.1:{receiver_port}", "--lease-ms", "3000", "--allow-fault-injection"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "IDEM_PY_PYTHON": sys.executable})
        ok = wait_for(lambda: self.healthy(receiver_port), 60, 0.2)
        if not ok:
            raise SystemExit("the receiver did not start (target/test-logs/sending-receiver.log)")
        self.proxy = Proxy(proxy_port, receiver_port)
        self.env = {"DATABASE_URL": self.sender_db, "RECEIVER_URL": f"http://127.0.0.1:{proxy_port}/charges",
                    "SEND_LEASE_MS": str(LEASE_MS), "SEND_TIMEOUT_MS": str(TIMEOUT_MS)}

    @staticmethod
    def healthy(port) -> bool:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/healthz")
            return c.getresponse().status == 200
        except OSError:
            return False

    def stop(self):
        self.receiver.terminate()
        self.receiver.wait(10)
        self.proxy.down()

    def sender_sql(self, sql, args=(), db: str | None = None):
        with psycopg.connect(db or self.sender_db, autocommit=True) as c:
            cur = c.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def faults_pg_ctl(self, *args: str) -> None:
        """pg_ctl on the send-faults cluster (as the postgres user: PostgreSQL refuses root)."""
        cmd = [os.path.join(self.pg_bin, "pg_ctl"), "-D", os.path.join(self.faults_dir, "data"), "-w", *args]
        if os.getuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def effects(self, tenant: str) -> int:
        with psycopg.connect(self.receiver_db, autocommit=True) as c:
            return c.execute("SELECT count(*) FROM charges WHERE tenant = %s", (tenant,)).fetchone()[0]

    def keys_of(self, prefix: str, db: str | None = None) -> dict[str, str]:
        rows = self.sender_sql("SELECT id, payment_key FROM send_demo_orders WHERE id LIKE %s", (prefix + "-%",), db)
        return dict(rows)

    def states(self, prefix: str, db: str | None = None) -> dict[str, str]:
        rows = self.sender_sql("SELECT operation, state FROM idempotency.outbound "
                               "WHERE scope = %s AND operation LIKE %s", (SCOPE, prefix + "-%"), db)
        return dict(rows)


# --- the scenarios -----------------------------------------------------------------------------

def sf(key: str) -> str:
    return '"' + key + '"'


def exactly_once(w: World, lang: str, name: str, prefix: str, count: int, tenant: str, states=("done",),
                 db: str | None = None):
    """Every operation ended in `states`, the receiver did each exactly once, and every request
    of an operation carried that operation's key (the one kept with its order)."""
    keys = w.keys_of(prefix, db)
    got = w.states(prefix, db)
    check(f"{lang} {name}: every operation ended {'/'.join(states)}",
          len(got) == count and all(s in states for s in got.values()), str(got))
    check(f"{lang} {name}: exactly one side effect per operation at the receiver", w.effects(tenant) == count,
          f"{w.effects(tenant)} charges for {count} operations")
    sent = [k for k in w.proxy.keys()]
    kept = {sf(k) for k in keys.values()}
    check(f"{lang} {name}: every attempt carried its operation's one key", set(sent) <= kept and len(keys) == count,
          f"{len(set(sent) - kept)} keys the orders do not hold")


def scenario_happy(w: World, lang: Lang):
    w.proxy.reset()
    p, t = f"{lang.name}-happy", f"{lang.name}-happy"
    rc, out, err = lang.run("prepare", "5", p, tenant=t)
    check(f"{lang.name} happy: prepare", rc == 0 and out == ["prepared 5"], err[-500:])
    rc, out, err = lang.run("work", "--until-idle", tenant=t)
    check(f"{lang.name} happy: the worker ends when nothing is left", rc == 0, err[-500:])
    exactly_once(w, lang.name, "happy", p, 5, t)
    check(f"{lang.name} happy: one request per operation", len(w.proxy.log) == 5, str(len(w.proxy.log)))
    rc, out, err = lang.run("inline", "3", p + "i", tenant=t + "i")
    check(f"{lang.name} inline: each delivered right after its COMMIT, done 201",
          [x.split()[2:] for x in out if x.startswith("delivered")] == [["done", "201"]] * 3,
          "\n".join(out) + err[-300:])


def scenario_kills(w: World, lang: Lang):
    name = lang.name
    # (a) Killed before any attempt: the sends are committed with the orders; a new worker sends them.
    w.proxy.reset()
    p = t = f"{name}-kill-before"
    lang.run("prepare", "3", p, tenant=t)
    worker = lang.start("work", tenant=t)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    lang.run("work", "--until-idle", tenant=t)
    exactly_once(w, name, "killed before the first attempt", p, 3, t)

    # (b) Killed after the request left, before its answer was recorded: the receiver did the
    # work; the proxy holds the answer while the sender is killed. After the lease another
    # worker retries with the same key and gets the stored answer (a replay).
    w.proxy.reset("pass", ["hold"])
    p = t = f"{name}-kill-in-flight"
    lang.run("prepare", "1", p, tenant=t)
    worker = lang.start("work", tenant=t)
    held = w.proxy.held.wait(30)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    w.proxy.release.set()
    check(f"{name} killed in flight: the receiver had done the work", held and w.effects(t) == 1)
    rc, out, err = lang.run("work", "--until-idle", tenant=t)
    exactly_once(w, name, "killed after the request left", p, 1, t)
    check(f"{name} killed in flight: retried after the lease with the same key (2 requests, 1 key)",
          len(w.proxy.log) == 2 and len(set(w.proxy.keys())) == 1, str(w.proxy.keys()))

    # (c) Killed while recording: the answer came back, but idem_send_result waits on a row
    # lock held here; the sender is killed there, the lock let go, a new worker finishes.
    w.proxy.reset("pass", ["hold"])
    p = t = f"{name}-kill-recording"
    lang.run("prepare", "1", p, tenant=t)
    worker = lang.start("work", tenant=t)
    w.proxy.held.wait(30)
    with psycopg.connect(w.sender_db) as locker:
        locker.execute("SELECT 1 FROM idempotency.outbound WHERE scope = %s AND operation LIKE %s FOR UPDATE",
                       (SCOPE, p + "-%"))
        w.proxy.release.set()
        blocked = wait_for(lambda: w.sender_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'send_sender' AND wait_event_type = 'Lock' "
            "AND query LIKE '%%idem_send_result%%'")[0][0] == 1, 30)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        locker.rollback()
    check(f"{name} killed while recording: the sender was waiting to record", bool(blocked))
    lang.run("work", "--until-idle", tenant=t)
    exactly_once(w, name, "killed while recording", p, 1, t)


def scenario_faults(w: World, lang: Lang):
    # Each step below retries once or twice, seconds after the step before it retried: under
    # the default budget the window's last sixth allows floor((0.1 x first attempts + 10) / 6)
    # = 1 retry in its 10 s, so each step would wait about 10 s for its retry. The budget has
    # scenarios of its own (budget, settings); here it is off.
    w.sender_sql("ALTER DATABASE send_sender SET idempotency.send_retry_budget = 1000000")
    try:
        faults_steps(w, lang)
    finally:
        w.sender_sql("ALTER DATABASE send_sender RESET idempotency.send_retry_budget")


def faults_steps(w: World, lang: Lang):
    name = lang.name
    # The receiver down for a while, then up.
    w.proxy.reset()
    p = t = f"{name}-down"
    lang.run("prepare", "2", p, tenant=t)
    w.proxy.down()
    worker = lang.start("work", tenant=t)
    failed_attempts = wait_for(lambda: w.sender_sql(
        "SELECT count(*) FROM idempotency.outbound WHERE operation LIKE %s AND last_error IS NOT NULL", (p + "-%",)
    )[0][0] == 2, 30)
    w.proxy.up()
    wait_for(lambda: set(w.states(p).values()) == {"done"}, 60)
    worker.terminate()
    worker.wait(30)
    check(f"{name} receiver down: no answer recorded while it was down", bool(failed_attempts))
    exactly_once(w, name, "receiver down, then up", p, 2, t)

    # 503 twice, then the receiver.
    w.proxy.reset("pass", ["503", "503"])
    p = t = f"{name}-503"
    lang.run("prepare", "1", p, tenant=t)
    lang.run("work", "--until-idle", tenant=t)
    exactly_once(w, name, "503 twice", p, 1, t)
    check(f"{name} 503 twice: three requests, one key", len(w.proxy.log) == 3 and len(set(w.proxy.keys())) == 1)

    # 429 with Retry-After: 2: no attempt before it.
    w.proxy.reset("pass", ["429:2"])
    p = t = f"{name}-429"
    lang.run("prepare", "1", p, tenant=t)
    lang.run("work", "--until-idle", tenant=t)
    exactly_once(w, name, "429 with Retry-After", p, 1, t)
    gap = w.proxy.log[1]["t"] - w.proxy.log[0]["t"] if len(w.proxy.log) == 2 else 0
    check(f"{name} 429: the retry came after Retry-After (2 s)", gap >= 2.0, f"{gap:.2f} s")

    # The answer dropped after the receiver did the work: the retry gets the replay.
    w.proxy.reset("pass", ["drop"])
    p = t = f"{name}-drop"
    lang.run("prepare", "1", p, tenant=t)
    lang.run("work", "--until-idle", tenant=t)
    exactly_once(w, name, "answer dropped after the work", p, 1, t)

    # 409 (the receiver still works on the key): retried.
    w.proxy.reset("pass", ["409"])
    p = t = f"{name}-409"
    lang.run("prepare", "1", p, tenant=t)
    lang.run("work", "--until-idle", tenant=t)
    exactly_once(w, name, "409", p, 1, t)
    check(f"{name} 409: retried with the same key", len(w.proxy.log) == 2 and len(set(w.proxy.keys())) == 1)

    # A retry while the first attempt still runs: the first request takes 3 s at the receiver,
    # the sender stops waiting after 1 s (no answer) and retries into the running claim, which
    # the receiver answers when the first is done (its middleware waits for it) or with 409.
    w.proxy.reset("pass", ["delay:3000"])
    p = t = f"{name}-overlap"
    lang.run("prepare", "1", p, tenant=t)
    lang.run("work", "--until-idle", tenant=t)
    statuses = [e.get("status") for e in w.proxy.log]
    check(f"{name} overlap: retried while the first attempt ran", len(statuses) >= 2, str(statuses))
    exactly_once(w, name, "a retry while the first attempt runs", p, 1, t)

    # 422: a final answer, not retried.
    w.proxy.reset("pass", ["422"])
    p = t = f"{name}-422"
    lang.run("prepare", "1", p, tenant=t)
    lang.run("work", "--until-idle", tenant=t)
    st = w.sender_sql("SELECT state, response_status, attempts FROM idempotency.outbound WHERE operation LIKE %s",
                      (p + "-%",))
    check(f"{name} 422: done with 422 after one attempt", st == [("done", 422, 1)], str(st))

    # The receiver forgot the key (its record expired; tombstones on): the first answer is
    # lost with its sender, the record expires at the receiver, the retry gets 410 and nothing
    # runs again.
    w.proxy.reset("pass", ["hold"])
    p = t = f"{name}-410"
    lang.run("prepare", "1", p, tenant=t)
    worker = lang.start("work", tenant=t)
    w.proxy.held.wait(30)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    w.proxy.release.set()
    with psycopg.connect(w.receiver_db, autocommit=True) as c:
        c.execute("UPDATE idempotency.keys SET expires_at = now() - interval '1 second' WHERE scope LIKE %s",
                  (f"{t}%",))
    lang.run("work", "--until-idle", tenant=t)
    st = w.sender_sql("SELECT state, response_status FROM idempotency.outbound WHERE operation LIKE %s", (p + "-%",))
    check(f"{name} 410: done with 410, the work not run again", st == [("done", 410)] and w.effects(t) == 1,
          f"{st}, {w.effects(t)} charges")


def scenario_give_up(w: World, lang: Lang):
    name = lang.name
    w.proxy.reset()
    p = t = f"{name}-give-up"
    w.sender_sql("ALTER DATABASE send_sender SET idempotency.send_give_up_after = '2 seconds'")
    try:
        lang.run("prepare", "3", p, tenant=t)
        w.proxy.down()
        rc, out, err = lang.run("work", "--until-idle", tenant=t)
    finally:
        w.sender_sql("ALTER DATABASE send_sender RESET idempotency.send_give_up_after")
        w.proxy.up()
    got = w.states(p)
    check(f"{name} give up: every operation ended gave_up", len(got) == 3 and set(got.values()) == {"gave_up"},
          str(got))
    check(f"{name} give up: reported as unknown, never as failed or done",
          all(x.endswith("gave_up unknown") for x in out if x.startswith("finished")), "\n".join(out))
    late = w.sender_sql("SELECT count(*) FROM idempotency.outbound WHERE operation LIKE %s "
                        "AND finished_at > give_up_at + interval '1 second'", (p + "-%",))[0][0]
    check(f"{name} give up: nothing attempted after give_up_at", late == 0, f"{late} finished late: " + str(
        w.sender_sql("SELECT attempts, give_up_at - created_at, finished_at - give_up_at, last_error "
                     "FROM idempotency.outbound WHERE operation LIKE %s", (p + "-%",))))


def scenario_budget(w: World, lang: Lang):
    """N senders against a receiver that is down: attempts within the budget's arithmetic."""
    name = lang.name
    results = {}
    for label, budget in (("budget 0.1", "0.1"), ("budget off", "1000000")):
        w.proxy.reset("503")
        p = t = f"{name}-{label.replace(' ', '-').replace('.', '')}"
        w.sender_sql(f"ALTER DATABASE send_sender SET idempotency.send_retry_budget = {budget}")
        try:
            target_env = {"TARGET": p}
            lang.run("prepare", "40", p, tenant=t, **target_env)
            workers = [lang.start("work", tenant=t, **target_env) for _ in range(4)]
            time.sleep(8)
            for wk in workers:
                wk.terminate()
            for wk in workers:
                wk.wait(30)
        finally:
            w.sender_sql("ALTER DATABASE send_sender RESET idempotency.send_retry_budget")
        firsts = len({k for k in w.proxy.keys()})
        total = len(w.proxy.log)
        results[label] = (firsts, total)
        print(f"     {label}: 4 senders, 40 sends, receiver answering 503 for 8 s: {total} requests "
              f"({firsts} first attempts, {total - firsts} retries)", flush=True)
    firsts, total = results["budget 0.1"]
    check(f"{name} budget: every first attempt was made", firsts == 40, str(firsts))
    bound = firsts + int(0.1 * firsts + 10)
    check(f"{name} budget: retries within 0.1 x first attempts + 10 a minute ({total} <= {bound})", total <= bound)
    off = results["budget off"][1]
    check(f"{name} budget: without it the same run sends more ({off} against {total})", off > total)


def stop_worker(p: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM, then the exit code (-9 if it had to be killed)."""
    p.terminate()
    try:
        p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return -9
    return p.returncode


def overlapping(log: list[dict]) -> list[str]:
    """Keys with two requests in flight at once (one began before the other's exchange ended;
    50 ms of leeway for the proxy's own threads)."""
    bad = []
    for key in {e["key"] for e in log}:
        mine = sorted((e for e in log if e["key"] == key), key=lambda e: e["t"])
        if any(b["t"] < a["end"] - 0.05 for a, b in zip(mine, mine[1:], strict=False)):
            bad.append(key)
    return bad


TRICKLE_MS = 200
CLOSE_MARGIN = 0.75  # seconds after the timeout by which the sender has closed a trickled attempt


def scenario_timeout(w: World, lang: Lang):
    """The sender's timeout bounds an attempt in total: a receiver that answers a byte every
    200 ms (no socket read waits long enough for a per-read timeout) is given up on by the
    timeout, before the lease ends, so no two attempts of one operation are in flight at once,
    though two workers wait to take the sends over. A timeout not below the lease is refused."""
    name = lang.name
    rc, out, err = lang.run("work", "--until-idle", tenant=f"{name}-refused", timeout=60,
                            SEND_TIMEOUT_MS="1500", SEND_LEASE_MS="1500")
    check(f"{name} timeout: a timeout not below the lease is refused (exit 2, 'refused ...')",
          rc == 2 and any(x.startswith("refused ") for x in out), f"exit {rc}: {out} {err[-300:]}")

    timeout, lease = 1.0, 2.0
    p = t = f"{name}-timeout"
    # A target of its own: the retry budget of the shared one may be spent by the scenarios before.
    env = {"SEND_TIMEOUT_MS": str(int(timeout * 1000)), "SEND_LEASE_MS": str(int(lease * 1000)), "TARGET": p}
    count = 3
    w.proxy.reset("pass", [f"trickle:{TRICKLE_MS}"] * count)
    lang.run("prepare", str(count), p, tenant=t, **env)
    workers = [lang.start("work", "--until-idle", tenant=t, **env) for _ in range(2)]
    codes = []
    for wk in workers:
        try:
            wk.communicate(timeout=90)
            codes.append(wk.returncode)
        except subprocess.TimeoutExpired:
            codes.append(stop_worker(wk))
    check(f"{name} timeout: both workers ended when nothing was left", codes == [0, 0], str(codes))
    trickled = [e for e in w.proxy.log if e["mode"].startswith("trickle")]
    slow = [len(e.get("answer", b"")) * TRICKLE_MS / 1000 for e in trickled]
    check(f"{name} timeout: each operation's first attempt got a trickle that would outlast the lease",
          len(trickled) == count and all(s > lease for s in slow), f"{len(trickled)} trickled, {slow} s each")
    spans = [round(e["end"] - e["t"], 2) for e in trickled]
    check(f"{name} timeout: the sender closed each trickled connection within timeout + {CLOSE_MARGIN} s "
          f"({timeout + CLOSE_MARGIN} s < the lease, {lease} s)",
          all(e["closed_by_sender"] for e in trickled) and all(s <= timeout + CLOSE_MARGIN for s in spans),
          f"open for {spans} s, closed by the sender: {[e['closed_by_sender'] for e in trickled]}")
    bad = overlapping(w.proxy.log)
    check(f"{name} timeout: no two attempts of one operation in flight at once", not bad,
          f"{len(bad)} keys: " + str([(round(e['t'] - w.proxy.log[0]['t'], 2), round(e['end'] - w.proxy.log[0]['t'], 2))
                                       for e in w.proxy.log if e["key"] in bad]))
    exactly_once(w, name, "timeout", p, count, t, states=("done", "gave_up"))


def scenario_db_faults(w: World, lang: Lang):
    """The worker outlives its database: its backends terminated, then its server restarted
    (down for a second) while sends flow. It never exits, says db-error / db-reconnected, and
    every operation still ends done with exactly one side effect; SIGTERM ends it (exit 0)."""
    name, db = lang.name, w.faults_db
    p = t = f"{name}-db-faults"
    env = {"DATABASE_URL": db, "TARGET": p}
    w.proxy.reset("delay:150")
    lang.run("prepare", "12", p, tenant=t, **env)
    worker = Watched(lang.start("work", "--concurrency", "2", tenant=t, **env))

    def dead() -> bool:  # a worker that exited is waited for no longer
        return worker.p.poll() is not None

    flowing = wait_for(lambda: worker.count("finished ") >= 2 or dead(), 30) and not dead()
    terminated = w.sender_sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE datname = 'send_faults' AND pid <> pg_backend_pid()", db=db)[0][0]
    back = wait_for(lambda: worker.count("db-reconnected") >= 1 or dead(), 30) and not dead()
    check(f"{name} db faults: its backends terminated while sends flowed ({terminated}), it said db-error "
          "and db-reconnected", flowing and terminated >= 1 and back and worker.count("db-error ") >= 1,
          f"{terminated} terminated; " + " | ".join(worker.lines[-20:]) + " | " + " | ".join(worker.err[-5:]))

    lang.run("prepare", "10", f"{p}-b", tenant=t, **env)
    errors_before = worker.count("db-error ")
    w.faults_pg_ctl("-m", "fast", "stop")
    try:
        time.sleep(1.0)
        alive_while_down = worker.p.poll() is None
    finally:
        w.faults_pg_ctl("-l", os.path.join(w.faults_dir, "server.log"), "start")
    back = wait_for(lambda: worker.count("db-reconnected") >= 2 or dead(), 30) and not dead()
    check(f"{name} db faults: the server restarted under it: alive while it was down, db-error, db-reconnected",
          alive_while_down and worker.count("db-error ") > errors_before and back,
          " | ".join(worker.lines[-20:]) + " | " + " | ".join(worker.err[-5:]))
    all_done = wait_for(lambda: set(w.states(p, db).values()) == {"done"} or dead(), 60) and not dead()
    alive = worker.p.poll() is None
    rc = stop_worker(worker.p)
    check(f"{name} db faults: the worker never exited by itself; SIGTERM ended it with exit 0",
          alive and rc == 0, f"alive {alive}, exit {rc}: " + " | ".join(worker.err[-5:]))
    check(f"{name} db faults: every operation done", bool(all_done), str(w.states(p, db)))
    exactly_once(w, name, "database faults", p, 22, t, db=db)
    print(f"     {name} db faults: {worker.count('db-error ')} db-error lines, "
          f"{worker.count('db-reconnected')} db-reconnected", flush=True)


def run_for(lang: Lang, seconds: float, tenant: str, **env) -> int:
    worker = lang.start("work", tenant=tenant, **env)
    time.sleep(seconds)
    return stop_worker(worker)


def scenario_settings(w: World, lang: Lang):
    """The sender's own settings (SEND_GIVE_UP_AFTER_MS, SEND_RETRY_BUDGET, SEND_BACKOFF_BASE_MS,
    SEND_BACKOFF_CAP_MS), in a database that sets none of them (its defaults: give up after 23
    hours, budget 0.1, backoff 1 s to 10 minutes)."""
    name, db = lang.name, w.faults_db
    fast = {"DATABASE_URL": db, "SEND_BACKOFF_BASE_MS": "10", "SEND_BACKOFF_CAP_MS": "20"}

    p = t = f"{name}-set-give-up"
    env = {**fast, "TARGET": p, "SEND_GIVE_UP_AFTER_MS": "1500"}
    w.proxy.reset()
    lang.run("prepare", "2", p, tenant=t, **env)
    w.proxy.down()
    try:
        rc, out, err = lang.run("work", "--until-idle", tenant=t, timeout=30, **env)
    finally:
        w.proxy.up()
    rows = w.sender_sql("SELECT state, give_up_at - created_at FROM idempotency.outbound WHERE operation LIKE %s",
                        (p + "-%",), db)
    check(f"{name} settings: SEND_GIVE_UP_AFTER_MS=1500 gives each send 1.5 s; with the receiver down all gave up",
          rc == 0 and rows == [("gave_up", timedelta(seconds=1.5))] * 2, f"exit {rc}: {rows} {err[-300:]}")

    p = t = f"{name}-set-budget-0"
    env = {**fast, "TARGET": p, "SEND_RETRY_BUDGET": "0"}
    w.proxy.reset("503")
    lang.run("prepare", "10", p, tenant=t, **env)
    rc = run_for(lang, 2.0, t, **env)
    check(f"{name} settings: SEND_RETRY_BUDGET=0: 10 first attempts answered 503, no retry in 2 s",
          rc == 0 and len(w.proxy.log) == 10, f"exit {rc}, {len(w.proxy.log)} requests")
    due = dict(w.sender_sql("SELECT key, extract(epoch FROM next_attempt_at)::float8 FROM idempotency.outbound "
                            "WHERE operation LIKE %s", (p + "-%",), db))
    after = [round(due[e["key"].strip('"')] - e["wall"], 3) for e in w.proxy.log if e["key"].strip('"') in due]
    check(f"{name} settings: SEND_BACKOFF_CAP_MS=20: each retry due within 20 ms (+ 0.5 s) of its 503",
          len(after) == 10 and all(a <= 0.52 for a in after), f"due {after} s after the request")

    p = t = f"{name}-set-budget-off"
    env = {**fast, "TARGET": p, "SEND_RETRY_BUDGET": "1000000"}
    w.proxy.reset("503")
    lang.run("prepare", "10", p, tenant=t, **env)
    rc = run_for(lang, 2.0, t, **env)
    allowed = 10 + int(0.1 * 10 + 10)  # the first attempts and the retries the database's budget (0.1) allows
    check(f"{name} settings: SEND_RETRY_BUDGET=1000000: more requests in 2 s than the database's budget allows "
          f"({len(w.proxy.log)} > {allowed})", rc == 0 and len(w.proxy.log) > allowed, f"exit {rc}")


SCENARIOS = {"happy": scenario_happy, "kills": scenario_kills, "faults": scenario_faults,
             "give_up": scenario_give_up, "budget": scenario_budget, "timeout": scenario_timeout,
             "db_faults": scenario_db_faults, "settings": scenario_settings}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg-port", type=int, required=True)
    ap.add_argument("--first-port", type=int, required=True)
    ap.add_argument("--faults-pg-port", type=int, required=True)
    ap.add_argument("--faults-pg-dir", required=True)
    ap.add_argument("--pg-bin", required=True)
    ap.add_argument("langs", nargs="*")
    args = ap.parse_args()
    specs = {p.stem: json.loads(p.read_text()) for p in sorted(SENDERS.glob("*.json"))}
    wanted = args.langs or sorted(specs)
    w = World(args)
    try:
        for name in wanted:
            if name not in specs:
                check(f"{name}: a sender file tests/sending/senders/{name}.json", False)
                continue
            spec = specs[name]
            if spec.get("build"):
                b = subprocess.run(spec["build"], cwd=ROOT, capture_output=True, text=True)
                if not check(f"{name}: the send demo builds", b.returncode == 0, b.stderr[-1000:]):
                    continue
            lang = Lang(name, spec, w.env)
            print(f"-- {name}", flush=True)
            only = os.environ.get("SENDING_SCENARIOS", " ".join(SCENARIOS)).split()
            for scenario in only:
                if scenario not in SCENARIOS:
                    check(f"{name} {scenario}: a scenario of run.py", False, f"known: {' '.join(SCENARIOS)}")
                elif scenario not in lang.scenarios:
                    skip(f"{name} {scenario}", f"not among the scenarios of tests/sending/senders/{name}.json")
                else:
                    began = time.monotonic()
                    SCENARIOS[scenario](w, lang)
                    print(f"     {name} {scenario}: {time.monotonic() - began:.1f} s", flush=True)
    finally:
        w.stop()
    if skipped:
        print(f"({skipped} skipped, each with its reason above; not counted as passed)")
    print(f"sending: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
