#!/usr/bin/python3
"""End-to-end tests of a demo app over real HTTP, with real faults: examples/charges-api, or any
app obeying the demo-app contract (the same routes in every client package).

    /usr/bin/python3 tests/e2e/run.py --service-bin target/clients/debug/charges-api
    /usr/bin/python3 tests/e2e/run.py --app-cmd "clients/python/demo/run-asgi --listen {listen} \
        --database-url {database_url} --lease-ms {lease_ms} --allow-fault-injection"

`--app-cmd` is a command template (split like a shell would, not run by a shell) with the
placeholders {listen} (127.0.0.1:PORT), {port}, {database_url} and {lease_ms}. The app must
honour X-Fault-Delay-Ms and X-Fault-Fail-Before on POST /charges/external (it needs
--allow-fault-injection, or its equivalent, in the template). With --service-bin (charges-api)
the gateway stub is started as well and the charges-api checks run too (gateway decline,
SIGKILL while the gateway works, a worker stalled past its lease, bare-token keys, 401's
WWW-Authenticate).

It builds nothing. It starts a throwaway PostgreSQL cluster (scripts/cluster.sh) with the
extension, the gateway stub (`charges-api gateway-stub`, charges-api only) and the app, then checks:

- a response lost on the way back (a TCP proxy drops it after the service answered: the
  504 case): the retry with the same key gets the same body, replayed, and one charge exists;
- 20 concurrent identical requests: one charge, one 201 that is not a replay, the rest 409
  or the replayed 201 (both endpoints);
- a key reused with another amount: 422 and no new charge;
- missing or malformed Idempotency-Key: 400 problem+json; missing tenant: 401;
- the key grammar of contract/contract.json's key_header: sf-strings and bare values of token
  characters (a bare UUID, k-1001) accepted, a bare value and its quoted form one key; a bare
  value with a space, comma, quote or semicolon, max_chars + 1 characters, two field lines: 400;
- every answer the contract describes (400 for a key, 409, 422) is its problem body exactly, as
  contract/contract.json gives it (type, title, status, detail, Retry-After where listed), and
  no answer takes a type in the contract's namespace that the contract does not describe;
- a slow handler (X-Fault-Delay-Ms): a duplicate gets 409 with Retry-After from the lease;
- a handler failing before its side effect (X-Fault-Fail-Before): 500, and the key runs as new;
- the app SIGKILLed mid-handler, restarted, the key retried: it completes once;
- the database stopped under the running app (pg_ctl stop -m fast): both routes answer the
  contract's 503 service-unavailable (problem+json, Retry-After), never an HTML page; started
  again, the key refused meanwhile runs once and the keys answered before replay;
- the service SIGKILLed while the gateway is working on its charge, restarted, and the key
  retried after the lease ended: the charge completes once and the gateway charged once;
- a worker that stalls past its lease after the gateway charged: a retry takes over and
  finishes without calling the gateway again; the stalled worker's late completion is fenced.

Each check prints a line; the last line is "e2e: N passed, M failed"; the exit code is 1 if
anything failed. Every process it starts is stopped at the end, also on a timeout.
Ports: --port PORT..PORT+3 (PostgreSQL, gateway stub, service, proxy; run.sh gives tests/lib.sh's).
"""

import argparse
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import uuid

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
LEASE_MS = 2000  # the service's lease; it renews it every third of that while the gateway works

passed = 0
failed = 0
_print_lock = threading.Lock()


def check(name, ok, detail=""):
    global passed, failed
    with _print_lock:
        if ok:
            passed += 1
            print(f"ok   {name}", flush=True)
        else:
            failed += 1
            print(f"FAIL {name}" + (f": {detail}" if detail else ""), flush=True)
    return ok


# ---------------------------------------------------------------------------------------
# Processes


class Harness:
    def __init__(self, args):
        self.args = args
        self.pg_port = args.port
        self.gw_port = args.port + 1
        self.svc_port = args.port + 2
        self.proxy_port = args.port + 3
        self.dir = f"/tmp/idem-e2e-{os.getpid()}"
        self.procs = {}
        self.cluster_started = False
        self.db = None
        self.proxy = None
        self._cleaned = threading.Lock()
        self.charges_api = args.service_bin is not None
        self.dsn = f"host=127.0.0.1 port={self.pg_port} user=postgres dbname=postgres"
        self.db_url = f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    def log_path(self, name):
        return os.path.join(self.dir, f"{name}.log")

    def start_cluster(self):
        for port in (self.pg_port, self.gw_port, self.svc_port, self.proxy_port):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    raise RuntimeError(f"port {port} is already in use (use --port)")
        self.cluster_started = True
        # On 127.0.0.1 too: the apps and the proxy connect over TCP.
        subprocess.run([CLUSTER, "start", self.dir, str(self.pg_port), "listen_addresses = '127.0.0.1'"],
                       check=True, timeout=120)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION idempotency")
        self.db = psycopg.connect(self.dsn, autocommit=True)

    def spawn(self, name, argv, ready_port, tries=3):
        # A port of ours stopped a moment before may still be held ("Address already in use"),
        # so a few tries.
        for left in range(tries - 1, -1, -1):
            try:
                return self._spawn_once(name, argv, ready_port)
            except RuntimeError as e:
                if left == 0 or "in use" not in str(e).lower():
                    raise
                print(f"     ({name}: port {ready_port} busy, trying again)", flush=True)
                time.sleep(1)

    def _spawn_once(self, name, argv, ready_port):
        log = open(self.log_path(name), "ab")
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        deadline = time.time() + 30
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.log_path(name)}:\n"
                                   + self.tail(name))
            try:
                conn = http.client.HTTPConnection("127.0.0.1", ready_port, timeout=2)
                conn.request("GET", "/healthz" if name == "service" else "/_stats")
                conn.getresponse().read()
                conn.close()
                return proc
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{name} did not come up on port {ready_port}")

    def start_stub(self):
        self.spawn("gateway", [self.args.service_bin, "gateway-stub", "--listen", f"127.0.0.1:{self.gw_port}"],
                   self.gw_port)

    def start_service(self):
        fields = {"listen": f"127.0.0.1:{self.svc_port}", "port": self.svc_port,
                  "database_url": self.db_url, "lease_ms": LEASE_MS}
        self.spawn("service", [part.format(**fields) for part in shlex.split(self.args.app_cmd)], self.svc_port)

    def kill(self, name, sig=signal.SIGKILL):
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        # The whole process group: an app started through a wrapper script dies with it.
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def tail(self, name, lines=30):
        try:
            with open(self.log_path(name), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def cleanup(self, keep_logs=False):
        if not self._cleaned.acquire(blocking=False):
            return
        if self.proxy is not None:
            self.proxy.close()
        for name in list(self.procs):
            self.kill(name)
        if self.db is not None:
            try:
                self.db.close()
            except Exception:
                pass
        if self.cluster_started:
            subprocess.run([CLUSTER, "stop", self.dir], timeout=60)
        if keep_logs:
            print(f"(logs kept in {self.dir})", flush=True)
        elif os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)

    def stop_database(self):
        """Stops the suite's PostgreSQL (fast shutdown: sessions are cut) under the running app."""
        self.db.close()
        self.db = None
        subprocess.run([CLUSTER, "stop", self.dir], check=True, timeout=120)

    def start_database(self):
        subprocess.run([CLUSTER, "start", self.dir, str(self.pg_port)], check=True, timeout=120)
        self.db = psycopg.connect(self.dsn, autocommit=True)

    # --- database and stub observations ---

    def sql(self, query, *params):
        return self.db.execute(query, params).fetchall()

    def charges(self, tenant):
        return self.sql("SELECT count(*) FROM charges WHERE tenant = %s", tenant)[0][0]

    def record(self, scope, key):
        rows = self.sql("SELECT status, recovery_point, recovery_data, attempts, locked_until <= now() "
                        "FROM idempotency.idem_lookup(%s, %s)", scope, key)
        return rows[0] if rows else None

    def stub_stats(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.gw_port, timeout=10)
        conn.request("GET", "/_stats")
        stats = json.loads(conn.getresponse().read())
        conn.close()
        return stats

    def stub_delay(self, ms):
        conn = http.client.HTTPConnection("127.0.0.1", self.gw_port, timeout=10)
        conn.request("POST", "/_config", body=json.dumps({"delay_ms": ms}))
        conn.getresponse().read()
        conn.close()


# ---------------------------------------------------------------------------------------
# HTTP


class Resp:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    @property
    def replayed(self):
        return self.headers.get("idempotent-replayed") == "true"

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<{self.status} {self.headers} {self.body[:300]!r}>"


def quoted(key):
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def post(port, path, body, key=None, tenant=None, extra=(), timeout=30):
    """POST with http.client. `key` is sent as given (quote it yourself); `extra` is a list
    of (name, value) header lines, repeated names allowed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(data)))
        if tenant is not None:
            conn.putheader("X-Api-Key", tenant)
        if key is not None:
            conn.putheader("Idempotency-Key", key)
        for name, value in extra:
            conn.putheader(name, value)
        conn.endheaders(data)
        r = conn.getresponse()
        return Resp(r.status, r.getheaders(), r.read())
    finally:
        conn.close()


def get(port, path, tenant):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"X-Api-Key": tenant})
        r = conn.getresponse()
        return Resp(r.status, r.getheaders(), r.read())
    finally:
        conn.close()


def raw_post(port, path, header_lines, body):
    """POST over a bare socket, for header bytes http.client would not send."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        for line in header_lines:
            head += line + b"\r\n"
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        s.sendall(head + body)
        return read_http_response(s)


def read_http_message(sock):
    """Reads one HTTP/1.1 message with a Content-Length (or none); returns its bytes or None."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return head + b"\r\n\r\n" + rest


def read_http_response(sock):
    """Reads one HTTP/1.1 response with a Content-Length; returns Resp or None."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line]
    length = int(dict((k.lower(), v) for k, v in headers).get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return Resp(status, headers, rest[:length])


class DropResponseProxy:
    """A TCP proxy in front of the service that forwards each request, waits for the
    service's complete response, records it, and then drops the client's connection (RST)
    without sending it: the client sees the 504 case, "no answer", while the work was done."""

    def __init__(self, listen_port, target_port):
        self.target_port = target_port
        self.dropped = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", listen_port))
        self.sock.listen(16)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client):
        client.settimeout(30)
        try:
            request = read_http_message(client)  # the whole request: head and body
            if request is None:
                return
            with socket.create_connection(("127.0.0.1", self.target_port), timeout=30) as upstream:
                upstream.sendall(request)
                response = read_http_response(upstream)
            if response is not None:
                self.dropped.append(response)
        except OSError:
            pass
        finally:
            # Close with RST and without a byte of the response.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()

    def close(self):
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self.sock.close()


with open(os.path.join(ROOT, "contract", "contract.json")) as _f:
    CONTRACT = json.load(_f)
PROBLEMS = {p["slug"]: p for p in CONTRACT["problems"]}
MAX_KEY_CHARS = CONTRACT["key_header"]["max_chars"]


def is_contract_problem(r, slug):
    """The answer is the contract's problem `slug` (contract/contract.json): status, content
    type, and a body with exactly its type, title, status and detail; Retry-After where listed."""
    p = PROBLEMS[slug]
    if not is_problem(r, p["status"]):
        return False
    want = {"type": CONTRACT["problem_type_prefix"] + slug, "title": p["title"], "status": p["status"],
            "detail": p["detail"]}
    retry = r.headers.get("retry-after", "")
    return r.json() == want and (retry.isdigit() and int(retry) >= 1) == ("Retry-After" in p.get("headers", []))


def is_problem(r, status):
    if r.status != status or r.headers.get("content-type") != "application/problem+json":
        return False
    try:
        p = r.json()
    except ValueError:
        return False
    if not (p.get("status") == status and isinstance(p.get("type"), str) and isinstance(p.get("title"), str)
            and isinstance(p.get("detail"), str)):
        return False
    # The contract's namespace holds the contract's problems only, each exactly as described;
    # an application's own answers take another type (about:blank).
    prefix = CONTRACT["problem_type_prefix"]
    if p["type"].startswith(prefix):
        slug = p["type"][len(prefix):]
        d = PROBLEMS.get(slug)
        return d is not None and p == {"type": p["type"], "title": d["title"], "status": d["status"],
                                        "detail": d["detail"]}
    return True


# ---------------------------------------------------------------------------------------
# Scenarios

AMOUNT = {"amount": 500, "currency": "eur"}


def scenario_lost_response(h, route):
    tenant = f"acct_lost_{route.strip('/').replace('/', '_')}"
    key = str(uuid.uuid4())
    proxy = h.proxy
    proxy.dropped.clear()
    try:
        r = post(h.proxy_port, route, AMOUNT, quoted(key), tenant)
        got = f"an answer {r!r}"
    except (http.client.HTTPException, OSError) as e:
        got = None
        print(f"     (the client saw {type(e).__name__}: {e})")
    check(f"{route} lost response: the client got no answer (the proxy dropped it)", got is None, got or "")
    dropped = proxy.dropped[0] if proxy.dropped else None
    check(f"{route} lost response: the service had answered 201", dropped is not None and dropped.status == 201,
          repr(dropped))
    retry = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check(f"{route} lost response: the retry gets 201 with Idempotent-Replayed: true",
          retry.status == 201 and retry.replayed, repr(retry))
    check(f"{route} lost response: the retry's body is the lost response's body, byte for byte",
          dropped is not None and retry.body == dropped.body, f"{retry.body!r} vs {dropped and dropped.body!r}")
    check(f"{route} lost response: the retry's Location is the lost response's",
          dropped is not None and retry.headers.get("location") == dropped.headers.get("location")
          and retry.headers.get("location", "").startswith("/charges/ch_"), repr(retry.headers))
    check(f"{route} lost response: exactly one charge row", h.charges(tenant) == 1, str(h.charges(tenant)))
    location = retry.headers.get("location", "/charges/none")
    got = get(h.svc_port, location, tenant)
    check(f"{route} lost response: GET Location finds the charge",
          got.status == 200 and got.json()["id"] == retry.json()["id"], repr(got))
    other = get(h.svc_port, location, tenant + "_other")
    check(f"{route} lost response: another tenant's GET is a 404 problem", is_problem(other, 404), repr(other))


def scenario_concurrent(h, route, n=20, extra=()):
    tenant = f"acct_conc_{route.strip('/').replace('/', '_')}"
    key = str(uuid.uuid4())
    barrier = threading.Barrier(n)
    answers = [None] * n

    def one(i):
        try:
            barrier.wait(timeout=10)
            answers[i] = post(h.svc_port, route, AMOUNT, quoted(key), tenant, extra=extra)
        except Exception as e:  # recorded as a failed answer
            answers[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    errors = [a for a in answers if not isinstance(a, Resp)]
    check(f"{route} {n} concurrent: every request got an answer", not errors, repr(errors[:3]))
    resps = [a for a in answers if isinstance(a, Resp)]
    firsts = [r for r in resps if r.status == 201 and not r.replayed]
    replays = [r for r in resps if r.status == 201 and r.replayed]
    conflicts = [r for r in resps if r.status == 409]
    others = [r for r in resps if r.status not in (201, 409)]
    check(f"{route} {n} concurrent: exactly one 201 that is not a replay", len(firsts) == 1,
          f"{len(firsts)} firsts, {len(replays)} replays, {len(conflicts)} 409s, others {others[:2]!r}")
    check(f"{route} {n} concurrent: the rest are replayed 201s or 409s ({len(replays)} replays, {len(conflicts)} 409s)",
          not others and len(replays) + len(conflicts) == n - 1, repr(others[:2]))
    check(f"{route} {n} concurrent: every 409 is the contract's idempotency-key-in-progress, with Retry-After",
          all(is_contract_problem(r, "idempotency-key-in-progress") for r in conflicts),
          repr(conflicts[:1]))
    check(f"{route} {n} concurrent: every replay has the first response's body",
          len(firsts) == 1 and all(r.body == firsts[0].body for r in replays))
    check(f"{route} {n} concurrent: exactly one charge row", h.charges(tenant) == 1, str(h.charges(tenant)))
    if route == "/charges/external" and h.charges_api:
        stats = h.stub_stats()
        gw_id = firsts[0].json()["gateway_charge_id"] if len(firsts) == 1 else None
        charged = [e for e in stats["keys"].values() if e["response"].get("id") == gw_id]
        check(f"{route} {n} concurrent: the gateway was called once and charged once",
              len(charged) == 1 and charged[0]["charges"] == 1 and charged[0]["requests"] == 1, repr(charged))
    # after the dust settles: a plain retry is a replay
    again = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check(f"{route} {n} concurrent: a later retry replays the same body",
          again.status == 201 and again.replayed and len(firsts) == 1 and again.body == firsts[0].body, repr(again))


def scenario_mismatch(h, route):
    tenant = f"acct_mismatch_{route.strip('/').replace('/', '_')}"
    key = str(uuid.uuid4())
    first = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check(f"{route} mismatch: first request 201", first.status == 201 and not first.replayed, repr(first))
    other = post(h.svc_port, route, {"amount": 501, "currency": "eur"}, quoted(key), tenant)
    check(f"{route} mismatch: the key with another amount gets a 422 problem, the contract's idempotency-key-reused",
          is_contract_problem(other, "idempotency-key-reused"), repr(other))
    check(f"{route} mismatch: no new charge", h.charges(tenant) == 1, str(h.charges(tenant)))
    same = post(h.svc_port, route, {"currency": "eur", "amount": 500.0}, quoted(key), tenant)
    check(f"{route} mismatch: the same JSON written differently is not a mismatch (canonical fingerprint)",
          same.status == 201 and same.replayed and same.body == first.body, repr(same))
    elsewhere = post(h.svc_port, route, {"amount": 501, "currency": "eur"}, quoted(key), tenant + "_other")
    check(f"{route} mismatch: the same key in another tenant's scope is a new request",
          elsewhere.status == 201 and not elsewhere.replayed, repr(elsewhere))


def scenario_bad_requests(h):
    tenant = "acct_bad"
    body = json.dumps(AMOUNT).encode()
    cases = [
        ("missing", None),
        ("empty quoted string", '""'),
        ("empty value", ""),
        (f"{MAX_KEY_CHARS + 1} characters (quoted)", quoted("k" * (MAX_KEY_CHARS + 1))),
        (f"{MAX_KEY_CHARS + 1} characters (bare)", "k" * (MAX_KEY_CHARS + 1)),
        ("tab inside", '"a\tb"'),
        ("no closing quote", '"abc'),
        ("parameters after the string", '"abc";p=1'),
        ("a bad escape", '"a\\nb"'),
        # contract/contract.json's key_header: a bare value holds RFC 9110 token characters only
        ("a bare value with a space", "a b"),
        ("a bare value with a comma", "a,b"),
        ("a bare value with a quote inside", 'a"b'),
        ("a bare value with a semicolon", "a;b"),
        ("non-ASCII", '"caf\u00e9"'),
    ]
    for name, key in cases:
        if key is None:
            r = post(h.svc_port, "/charges", AMOUNT, None, tenant)
        else:
            r = raw_post(h.svc_port, "/charges", [b"X-Api-Key: " + tenant.encode(),
                                                  b"Idempotency-Key: " + key.encode("utf-8")], body)
        slug = "idempotency-key-missing" if key is None else "idempotency-key-invalid"
        check(f"bad key ({name}): 400 problem+json, the contract's {slug}",
              r is not None and is_contract_problem(r, slug), repr(r))
    two = post(h.svc_port, "/charges", AMOUNT, '"k-a"', tenant, extra=[("Idempotency-Key", '"k-b"')])
    check("bad key (two Idempotency-Key field lines): 400 problem+json, the contract's idempotency-key-invalid",
          is_contract_problem(two, "idempotency-key-invalid"), repr(two))
    # A control character other than tab is refused by the HTTP parser itself (hyper), before
    # the application sees the request: a 400, without a problem body.
    ctl = raw_post(h.svc_port, "/charges", [b"X-Api-Key: acct_bad", b'Idempotency-Key: "a\x01b"'], body)
    check("bad key (a control character): 400", ctl is not None and ctl.status == 400, repr(ctl))
    for route in ("/charges", "/charges/external"):
        r = post(h.svc_port, route, AMOUNT, quoted(str(uuid.uuid4())), None)
        check(f"{route} missing X-Api-Key: 401 problem+json", is_problem(r, 401), repr(r))
        if h.charges_api:
            check(f"{route} missing X-Api-Key: the 401 has WWW-Authenticate", "www-authenticate" in r.headers,
                  repr(r))
        r = post(h.svc_port, route, AMOUNT, None, None)
        check(f"{route} missing X-Api-Key and key: 401 first", is_problem(r, 401), repr(r))
        r = post(h.svc_port, route, AMOUNT, None, tenant)
        check(f"{route} missing key: 400 problem+json, the contract's idempotency-key-missing",
              is_contract_problem(r, "idempotency-key-missing"), repr(r))
    check("bad requests: no charge row, no idempotency record",
          h.charges(tenant) == 0
          and h.sql("SELECT count(*) FROM idempotency.keys WHERE scope LIKE 'acct_bad:%%'")[0][0] == 0)

    # accepted forms (contract/contract.json's key_header): the longest key, quoted and bare; a
    # bare value of token characters (a UUID, k-1001) names the same key as its quoted form
    for form, key in (("quoted", quoted("q" * MAX_KEY_CHARS)), ("bare", "b" * MAX_KEY_CHARS)):
        r = post(h.svc_port, "/charges", AMOUNT, key, "acct_good")
        check(f"key of {MAX_KEY_CHARS} characters ({form}): 201", r.status == 201 and not r.replayed, repr(r))
    # A UUID starting with a digit: no RFC 8941 bare item (it reads as a number), yet a token.
    for name, bare in (("a bare UUID", "1" + str(uuid.uuid4())[1:]), ("a bare k-1001", "k-1001")):
        r1 = post(h.svc_port, "/charges", AMOUNT, bare, "acct_bare")
        r2 = post(h.svc_port, "/charges", AMOUNT, quoted(bare), "acct_bare")
        check(f"{name} is accepted: 201", r1.status == 201 and not r1.replayed, repr(r1))
        check(f"{name} and its quoted form are one key (the second is a replay)",
              r2.status == 201 and r2.replayed and r2.body == r1.body, repr(r2))
    check("the bare keys made one charge each", h.charges("acct_bare") == 2, str(h.charges("acct_bare")))
    if h.charges_api:  # the contract asks for sf-strings; charges-api also takes a bare sf-token
        r1 = post(h.svc_port, "/charges", AMOUNT, '"tok-1:a/b"', "acct_good")
        r2 = post(h.svc_port, "/charges", AMOUNT, "tok-1:a/b", "acct_good")
        check("a quoted key and the same bare token are one key (the second is a replay)",
              r1.status == 201 and not r1.replayed and r2.status == 201 and r2.replayed and r1.body == r2.body,
              f"{r1!r} {r2!r}")
    r3 = post(h.svc_port, "/charges", AMOUNT, r'"q\"uo\\te"', "acct_good")
    row = h.sql("SELECT count(*) FROM idempotency.keys WHERE scope = 'acct_good:POST /charges' AND key = %s",
                'q"uo\\te')[0][0]
    check("a quoted key's escapes are undone before the claim", r3.status == 201 and row == 1, f"{r3!r} rows={row}")

    # a body that fails validation is refused before the claim: the key stays free
    key = str(uuid.uuid4())
    bad = post(h.svc_port, "/charges", b'{"amount": "lots"', quoted(key), "acct_good")
    check("a body that is not valid JSON: 400 problem+json", is_problem(bad, 400), repr(bad))
    bad2 = post(h.svc_port, "/charges", {"amount": -5, "currency": "eur"}, quoted(key), "acct_good")
    check("a negative amount: 400 problem+json", is_problem(bad2, 400), repr(bad2))
    good = post(h.svc_port, "/charges", AMOUNT, quoted(key), "acct_good")
    check("the same key with a valid body then runs as new (nothing was claimed)",
          good.status == 201 and not good.replayed, repr(good))


def scenario_decline(h):
    tenant = "acct_decline"
    key = str(uuid.uuid4())
    body = {"amount": 1_000_000, "currency": "eur"}
    first = post(h.svc_port, "/charges/external", body, quoted(key), tenant)
    again = post(h.svc_port, "/charges/external", body, quoted(key), tenant)
    check("/charges/external decline: a 402 problem is stored", is_problem(first, 402) and not first.replayed,
          repr(first))
    check("/charges/external decline: the retry replays the 402, same body",
          is_problem(again, 402) and again.replayed and again.body == first.body, repr(again))
    check("/charges/external decline: no charge row", h.charges(tenant) == 0)


def wait_for(what, cond, timeout=15, every=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


def retry_until_not_409(h, route, body, key, tenant, timeout=20):
    deadline = time.time() + timeout
    seen_409 = 0
    while True:
        r = post(h.svc_port, route, body, key, tenant)
        if r.status != 409 or time.time() > deadline:
            return r, seen_409
        seen_409 += 1
        time.sleep(0.2)


def scenario_slow_handler(h):
    route, tenant, key = "/charges/external", "acct_slow", str(uuid.uuid4())
    outcome = {}

    def slow():
        outcome["resp"] = post(h.svc_port, route, AMOUNT, quoted(key), tenant,
                               extra=[("X-Fault-Delay-Ms", str(int(LEASE_MS * 1.75)))])

    t = threading.Thread(target=slow)
    t.start()
    wait_for("the claim", lambda: h.record(f"{tenant}:POST {route}", key))
    dup = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    retry_after = dup.headers.get("retry-after", "")
    check("slow handler: a duplicate gets a 409 problem, the contract's idempotency-key-in-progress",
          is_contract_problem(dup, "idempotency-key-in-progress"), repr(dup))
    check(f"slow handler: Retry-After ({retry_after!r}) is from the lease: 1 to {LEASE_MS // 1000} s",
          retry_after.isdigit() and 1 <= int(retry_after) <= -(-LEASE_MS // 1000), repr(dup.headers))
    time.sleep(LEASE_MS / 1000 * 1.25)
    late = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check("slow handler: past its first lease the claim is still held (the lease was renewed): 409",
          is_contract_problem(late, "idempotency-key-in-progress"), repr(late))
    t.join(30)
    first = outcome.get("resp")
    check("slow handler: the first request completes: 201", first is not None and first.status == 201, repr(first))
    again = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check("slow handler: then the key replays the same body",
          first is not None and again.replayed and again.body == first.body, repr(again))
    check("slow handler: one charge row", h.charges(tenant) == 1, str(h.charges(tenant)))


def scenario_fail_before(h):
    # The contract's fault headers are for /charges/external; charges-api honours them on both.
    for route in ("/charges/external", "/charges") if h.charges_api else ("/charges/external",):
        tenant, key = f"acct_failb_{route.strip('/').replace('/', '_')}", str(uuid.uuid4())
        r = post(h.svc_port, route, AMOUNT, quoted(key), tenant, extra=[("X-Fault-Fail-Before", "1")])
        check(f"{route} failing before the side effect: 500 problem+json", is_problem(r, 500), repr(r))
        check(f"{route} failing before the side effect: no record left (released)",
              h.record(f"{tenant}:POST {route}", key) is None, repr(h.record(f"{tenant}:POST {route}", key)))
        again = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
        check(f"{route} failing before the side effect: the key then runs as new: 201, not a replay",
              again.status == 201 and not again.replayed, repr(again))
        check(f"{route} failing before the side effect: one charge row", h.charges(tenant) == 1,
              str(h.charges(tenant)))


def scenario_database_down(h):
    """The database stopped under the running app: every route answers the contract's 503 (a
    problem body, never a framework's HTML page, with Retry-After); once it is back the key
    refused meanwhile runs once and the keys answered before replay."""
    tenant = "acct_dbdown"
    routes = ("/charges", "/charges/external")
    before = {route: (str(uuid.uuid4()), None) for route in routes}
    for route, (key, _) in before.items():
        before[route] = (key, post(h.svc_port, route, AMOUNT, quoted(key), tenant))
        check(f"database down: {route} before the outage: 201", before[route][1].status == 201,
              repr(before[route][1]))
    during = {route: str(uuid.uuid4()) for route in routes}
    h.stop_database()
    try:
        for route in routes:
            for attempt in ("first", "second"):  # the second finds the pool's connections gone too
                try:  # an app that waits longer than this on its pool has not answered 503
                    r = post(h.svc_port, route, AMOUNT, quoted(during[route]), tenant, timeout=15)
                except (http.client.HTTPException, OSError) as e:
                    r = f"no answer within 15 s ({type(e).__name__}: {e})"
                ok = isinstance(r, Resp) and is_contract_problem(r, "service-unavailable")
                check(f"database down: {route} ({attempt} request) answers 503, the contract's "
                      "service-unavailable (problem+json, Retry-After)", ok, repr(r))
    finally:
        h.start_database()
    for route in routes:
        key = during[route]
        deadline = time.time() + 20
        r = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
        while r.status in (409, 503) and time.time() < deadline:  # the app's pool reconnecting
            time.sleep(0.5)
            r = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
        check(f"database back: {route} the key refused during the outage runs: 201, not a replay",
              r.status == 201 and not r.replayed, repr(r))
        again = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
        check(f"database back: {route} then it replays the same body",
              again.replayed and again.body == r.body, repr(again))
        old_key, old = before[route]
        replay = post(h.svc_port, route, AMOUNT, quoted(old_key), tenant)
        check(f"database back: {route} the key answered before the outage replays its body",
              replay.status == 201 and replay.replayed and replay.body == old.body, repr(replay))
    check("database down: one charge per key (4)", h.charges(tenant) == 4, str(h.charges(tenant)))


def scenario_kill_mid_handler(h):
    route, tenant, key = "/charges/external", "acct_killh", str(uuid.uuid4())
    scope = f"{tenant}:POST {route}"
    outcome = {}

    def doomed():
        try:
            outcome["resp"] = post(h.svc_port, route, AMOUNT, quoted(key), tenant,
                                   extra=[("X-Fault-Delay-Ms", str(LEASE_MS * 10))], timeout=60)
        except Exception as e:
            outcome["error"] = e

    t = threading.Thread(target=doomed)
    t.start()
    wait_for("the claim", lambda: h.record(scope, key))
    time.sleep(LEASE_MS / 1000 * 1.5)
    rec = h.record(scope, key)
    check("kill mid-handler: past its first lease, the renewed claim is live",
          rec is not None and rec[0] == "in_progress" and rec[4] is False, repr(rec))
    h.kill("service", signal.SIGKILL)
    t.join(10)
    check("kill mid-handler: the in-flight request got no answer (SIGKILL)", "error" in outcome, repr(outcome))
    h.start_service()
    r, n409 = retry_until_not_409(h, route, AMOUNT, quoted(key), tenant)
    check(f"kill mid-handler: after restart the retry (after {n409} 409s) completes: 201, not a replay",
          r.status == 201 and not r.replayed, repr(r))
    check("kill mid-handler: exactly one charge row", h.charges(tenant) == 1, str(h.charges(tenant)))
    rec = h.record(scope, key)
    check("kill mid-handler: the record is completed after 2 claims",
          rec is not None and rec[0] == "completed" and rec[3] == 2, repr(rec))
    again = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check("kill mid-handler: a later retry replays the same body", again.replayed and again.body == r.body,
          repr(again))


def scenario_kill_mid_gateway(h):
    route, tenant, key = "/charges/external", "acct_kill", str(uuid.uuid4())
    scope = f"{tenant}:POST {route}"
    h.stub_delay(3 * LEASE_MS)
    outcome = {}

    def doomed():
        try:
            outcome["resp"] = post(h.svc_port, route, AMOUNT, quoted(key), tenant, timeout=30)
        except Exception as e:
            outcome["error"] = e

    t = threading.Thread(target=doomed)
    t.start()
    try:
        rec = wait_for("the checkpoint before the gateway call",
                       lambda: (r := h.record(scope, key)) and r[1] == "gateway_call_started" and r)
        gateway_key = rec[2]["gateway_key"]
        wait_for("the gateway to receive the charge", lambda: gateway_key in h.stub_stats()["keys"])
        time.sleep(LEASE_MS / 1000 * 1.5)  # the lease is renewed while the gateway sleeps
        rec = h.record(scope, key)
        check("kill: while the gateway is slow, the heartbeat keeps the lease alive",
              rec is not None and rec[0] == "in_progress" and rec[4] is False, repr(rec))
        h.kill("service", signal.SIGKILL)
        t.join(10)
        check("kill: the in-flight request got no answer (SIGKILL)", "error" in outcome, repr(outcome))
    finally:
        h.stub_delay(0)
    h.start_service()
    r, n409 = retry_until_not_409(h, route, AMOUNT, quoted(key), tenant)
    check(f"kill: after restart the retry (after {n409} 409s until the lease ended) completes: 201, not a replay",
          r.status == 201 and not r.replayed, repr(r))
    stats = h.stub_stats()["keys"].get(gateway_key, {})
    check("kill: the gateway charged once for the operation (the takeover repeated the call with the same gateway key)",
          stats.get("charges") == 1 and stats.get("requests") == 2, repr(stats))
    check("kill: the response carries the gateway's charge",
          r.status == 201 and r.json()["gateway_charge_id"] == stats.get("response", {}).get("id"), repr(r))
    check("kill: exactly one charge row", h.charges(tenant) == 1, str(h.charges(tenant)))
    rec = h.record(scope, key)
    check("kill: the record is completed after 2 claims", rec is not None and rec[0] == "completed" and rec[3] == 2,
          repr(rec))
    again = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check("kill: a later retry replays the same body", again.replayed and again.body == r.body, repr(again))


def scenario_stall_fencing(h):
    route, tenant, key = "/charges/external", "acct_stall", str(uuid.uuid4())
    scope = f"{tenant}:POST {route}"
    outcome = {}

    def stalled():
        try:
            outcome["resp"] = post(h.svc_port, route, AMOUNT, quoted(key), tenant,
                                   extra=[("X-Fault-Pause-After-Gateway-Ms", str(int(LEASE_MS * 2.5)))])
        except Exception as e:
            outcome["error"] = e

    t = threading.Thread(target=stalled)
    t.start()
    rec = wait_for("the checkpoint after the gateway call",
                   lambda: (r := h.record(scope, key)) and r[1] == "gateway_charged" and r)
    gateway_key = rec[2]["gateway_key"]
    wait_for("the stalled worker's lease to end", lambda: h.record(scope, key)[4], timeout=10)
    r = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check("stall: a retry after the lease ended takes over and completes: 201, not a replay",
          r.status == 201 and not r.replayed, repr(r))
    stats = h.stub_stats()["keys"].get(gateway_key, {})
    check("stall: the takeover resumed from the checkpoint 'gateway_charged' and did not call the gateway",
          stats.get("requests") == 1 and stats.get("charges") == 1, repr(stats))
    t.join(20)
    late = outcome.get("resp")
    check("stall: the stalled worker's late completion is fenced: it answers 409, the contract's "
          "idempotency-key-superseded, not 201",
          late is not None and is_contract_problem(late, "idempotency-key-superseded"), repr(outcome))
    check("stall: exactly one charge row", h.charges(tenant) == 1, str(h.charges(tenant)))
    again = post(h.svc_port, route, AMOUNT, quoted(key), tenant)
    check("stall: the stalled worker's retry replays the takeover's response",
          again.replayed and again.body == r.body, repr(again))


# ---------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--service-bin", help="the built charges-api binary (adds the charges-api checks)")
    target.add_argument("--app-cmd", help="a demo app's command template: {listen} {port} {database_url} {lease_ms}")
    ap.add_argument("--port", type=int, default=os.environ.get("E2E_PORT"), required="E2E_PORT" not in os.environ,
                    help="first of four ports: PostgreSQL, gateway stub, service, proxy (tests/e2e/run.sh and"
                    " run_demo_apps.sh take them from tests/lib.sh's port table; else $E2E_PORT)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds before the whole run is stopped")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--name", default="e2e", help="the suite's name in the last line (default e2e)")
    args = ap.parse_args()
    if args.service_bin:
        args.service_bin = os.path.abspath(args.service_bin)
        if not os.access(args.service_bin, os.X_OK):
            print(f"e2e: no executable at {args.service_bin}", file=sys.stderr)
            print(f"{args.name}: 0 passed, 1 failed")
            return 1
        args.app_cmd = (f"{shlex.quote(args.service_bin)} --database-url {{database_url}} --listen {{listen}}"
                        f" --gateway-url http://127.0.0.1:{args.port + 1} --lease-ms {{lease_ms}}"
                        " --pool-size 24 --allow-fault-injection")

    h = Harness(args)

    def on_timeout():
        print(f"FAIL the run took longer than {args.timeout:.0f} s; stopping", flush=True)
        for name in ("service", "gateway"):
            print(f"--- last lines of the {name} log ---\n{h.tail(name)}", flush=True)
        h.cleanup(keep_logs=args.keep_logs)
        print(f"{args.name}: {passed} passed, {failed + 1} failed", flush=True)
        os._exit(1)

    watchdog = threading.Timer(args.timeout, on_timeout)
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    started = time.time()
    external_delay = [("X-Fault-Delay-Ms", "300")]  # the first one stays in its handler for a while
    scenarios = [
        ("lost response, same transaction", lambda: scenario_lost_response(h, "/charges")),
        ("lost response, committed first", lambda: scenario_lost_response(h, "/charges/external")),
        ("20 concurrent, same transaction", lambda: scenario_concurrent(h, "/charges")),
        ("20 concurrent, committed first", lambda: scenario_concurrent(h, "/charges/external", extra=external_delay)),
        ("mismatch, same transaction", lambda: scenario_mismatch(h, "/charges")),
        ("mismatch, committed first", lambda: scenario_mismatch(h, "/charges/external")),
        ("bad requests", lambda: scenario_bad_requests(h)),
        ("slow handler: 409 with Retry-After", lambda: scenario_slow_handler(h)),
        ("failing before the side effect", lambda: scenario_fail_before(h)),
        ("SIGKILL mid-handler", lambda: scenario_kill_mid_handler(h)),
        ("the database down and back", lambda: scenario_database_down(h)),
    ]
    if h.charges_api:
        scenarios += [
            ("gateway decline", lambda: scenario_decline(h)),
            ("SIGKILL mid-gateway", lambda: scenario_kill_mid_gateway(h)),
            ("stall past the lease", lambda: scenario_stall_fencing(h)),
        ]
    try:
        h.start_cluster()
        if h.charges_api:
            h.start_stub()
        h.start_service()
        h.proxy = DropResponseProxy(h.proxy_port, h.svc_port)
        for name, run in scenarios:
            t0 = time.time()
            try:
                run()
                print(f"     ({name}: {time.time() - t0:.1f} s)", flush=True)
            except Exception as e:
                traceback.print_exc()
                check(f"scenario '{name}' ran to the end", False, f"{type(e).__name__}: {e}")
                if "service" not in h.procs or h.procs["service"].poll() is not None:
                    print(h.tail("service"), flush=True)
                    h.kill("service")
                    h.start_service()
    except Exception as e:
        traceback.print_exc()
        check("setup", False, f"{type(e).__name__}: {e}")
    finally:
        watchdog.cancel()
        if failed:
            for name in ("service", "gateway"):
                print(f"--- last lines of the {name} log ---\n{h.tail(name)}", flush=True)
        h.cleanup(keep_logs=args.keep_logs)
    print(f"(e2e ran in {time.time() - started:.1f} s)")
    print(f"{args.name}: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
