"""The sending suite's driver (tests/sending/README.md); run by tests/sending/run.sh, which
starts the cluster with the databases send_sender and send_receiver.

A real receiver (clients/python/demo/run-asgi: POST /charges, de-duplicated with the
extension, one row of `charges` per request that ran: the side effect) behind a fault proxy
run here (it logs the Idempotency-Key of every request and answers or fails as told), and
the send demo program of each language (tests/sending/senders/LANG.json) as real processes.
Each scenario uses its own tenant (X-Api-Key), so its side effects are counted apart.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
SENDERS = Path(__file__).resolve().parent / "senders"
SCOPE = "send-demo"
LEASE_MS = 1500
TIMEOUT_MS = 1000

passed = failed = 0


def check(name: str, ok: bool, detail: str = "") -> bool:
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}", flush=True)
    else:
        failed += 1
        print(f"FAIL {name}{': ' + detail if detail else ''}", flush=True)
    return ok


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
    with X-Fault-Delay-Ms: the receiver works that long). `down()` / `up()` close and reopen
    its port (connection refused meanwhile)."""

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
                entry = {"t": time.monotonic(), "key": self.headers.get("Idempotency-Key"), "mode": mode,
                         "body": body}
                with proxy.lock:
                    proxy.log.append(entry)
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
                self.answer(status, rheaders, answer)

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

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
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
        self.name, self.run_prefix, self.env = name, [str(ROOT / p) if "/" in p else p for p in spec["run"]], env

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


class World:
    def __init__(self, args):
        self.sender_db = f"postgresql://postgres@127.0.0.1:{args.pg_port}/send_sender"
        self.receiver_db = f"postgresql://postgres@127.0.0.1:{args.pg_port}/send_receiver"
        receiver_port, proxy_port = args.first_port, args.first_port + 1
        with psycopg.connect(self.receiver_db, autocommit=True) as c:
            c.execute("ALTER DATABASE send_receiver SET idempotency.tombstone_ttl = '1 hour'")
        with psycopg.connect(self.sender_db, autocommit=True) as c:
            c.execute("ALTER DATABASE send_sender SET idempotency.send_backoff_base = '50ms'")
            c.execute("ALTER DATABASE send_sender SET idempotency.send_backoff_cap = '300ms'")
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
                    "TARGET": "receiver", "SEND_LEASE_MS": str(LEASE_MS), "SEND_TIMEOUT_MS": str(TIMEOUT_MS)}

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

    def sender_sql(self, sql, args=()):
        with psycopg.connect(self.sender_db, autocommit=True) as c:
            cur = c.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def effects(self, tenant: str) -> int:
        with psycopg.connect(self.receiver_db, autocommit=True) as c:
            return c.execute("SELECT count(*) FROM charges WHERE tenant = %s", (tenant,)).fetchone()[0]

    def keys_of(self, prefix: str) -> dict[str, str]:
        rows = self.sender_sql("SELECT id, payment_key FROM send_demo_orders WHERE id LIKE %s", (prefix + "-%",))
        return dict(rows)

    def states(self, prefix: str) -> dict[str, str]:
        rows = self.sender_sql("SELECT operation, state FROM idempotency.outbound "
                               "WHERE scope = %s AND operation LIKE %s", (SCOPE, prefix + "-%"))
        return dict(rows)


# --- the scenarios -----------------------------------------------------------------------------

def sf(key: str) -> str:
    return '"' + key + '"'


def exactly_once(w: World, lang: str, name: str, prefix: str, count: int, tenant: str, states=("done",)):
    """Every operation ended in `states`, the receiver did each exactly once, and every request
    of an operation carried that operation's key (the one kept with its order)."""
    keys = w.keys_of(prefix)
    got = w.states(prefix)
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


SCENARIOS = {"happy": scenario_happy, "kills": scenario_kills, "faults": scenario_faults,
             "give_up": scenario_give_up, "budget": scenario_budget}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg-port", type=int, required=True)
    ap.add_argument("--first-port", type=int, required=True)
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
            only = os.environ.get("SENDING_SCENARIOS", "happy kills faults give_up budget").split()
            for scenario in only:
                if scenario != "budget" or name == "python":  # the budget's arithmetic: one language is enough
                    SCENARIOS[scenario](w, lang)
    finally:
        w.stop()
    print(f"sending: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
