#!/usr/bin/python3
"""Stress test of the idempotency extension, with faults, from real clients.

    PGUSER=postgres /usr/bin/python3 tests/stress/stress.py --host H --port P \
        --datadir D --seconds S --sessions N --keys K

N client sessions (threads, one psycopg connection each) run operations for S seconds over
a working set of K keys, half in each of the README's two modes (the scope tells the mode):

  same-tx          BEGIN; idem_claim; INSERT ledger row; idem_complete; COMMIT.
  committed-first  idem_claim committed alone with a 2 s lease; one idem_checkpoint; then
                   INSERT ledger row + idem_complete (fenced by the token) in one transaction.

Every response body holds the token of the claim that produced it, so a second execution
would show. A key leaves the working set once three answers were recorded for it and a
fresh key takes its place, so claims (not only replays) keep flowing all run long.

Faults: a thread terminates a random client backend every few hundred milliseconds and,
once, halfway through, crashes the server (pg_ctl stop -m immediate) and starts it again.
Some committed-first workers die on purpose right after claiming, or stall past their lease
(their late idem_complete must then fail with IK002). A background completer calls
idem_reclaim_stale(release => false) during the run and finishes what it took over; after
the run a recovery phase does the same until every key is completed. Then five checks run.

Then, with --send-seconds S2 > 0, the sending side for S2 seconds (tests/stress/senders.py):
--senders sender sessions on three targets whose receivers go down and come back; three more
checks, the first that no two senders deadlocked (pg_stat_database.deadlocks unchanged).
The last line is "stress: N passed, M failed" and the exit code is 1 on any failure.

D is the cluster's data directory (scripts/cluster.sh puts it in DIR/data; DIR is accepted
too). The program checks that the server it talks to runs from D before it crashes it.
"""

import argparse
import collections
import json
import os
import pwd
import random
import secrets
import subprocess
import sys
import threading
import time

import psycopg

import senders

# The server's own pg_ctl: --bindir, else $PGBIN (tests/lib.sh exports it), else Debian's 15.
DEFAULT_BINDIR = os.environ.get("PGBIN") or "/usr/lib/postgresql/15/bin"

LEASE = "2 seconds"          # committed-first claims and takeovers by the completer
LEASE_S = 2.0
TTL = "1 hour"
P_DIE = 0.03                 # committed-first worker closes its connection after claiming
P_STALL = 0.02               # ... or sleeps past its lease before checkpoint / complete
RETIRE_AFTER = 3             # answers recorded for a key before it leaves the working set
RECOVERY_SECONDS = 60        # bound on the recovery phase, after the leases have ended
STATEMENT_TIMEOUT = "30s"    # nothing should ever wait that long; a hang becomes an error

SAME_TX, COMMITTED_FIRST = "same-tx", "committed-first"

CLAIM = (
    "SELECT outcome, token, http_status, response_status, response_body, recovery_point, attempts "
    "FROM idempotency.idem_claim(%s, %s, idempotency.idem_fingerprint(%s::jsonb), "
    "%s::interval, %s::interval)"
)
CHECKPOINT = "SELECT idempotency.idem_checkpoint(%s, %s, %s, %s, %s::jsonb, %s::interval)"
RECLAIM = (
    "SELECT scope, key, token, attempts, recovery_point "
    "FROM idempotency.idem_reclaim_stale(100, false, %s::interval)"
)


def canon(body):
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def payload(key):
    """The request body for a key, with its fields in random order and random spacing:
    the fingerprint is of the canonical JSON, so no retry may ever get `mismatch`."""
    fields = [("key", key), ("amount", 100 + sum(map(ord, key)) % 900), ("currency", "EUR")]
    random.shuffle(fields)
    seps = random.choice([(",", ":"), (", ", ": ")])
    return json.dumps(dict(fields), separators=seps)


def classify(e):
    """What a psycopg error means for the client that got it."""
    state = getattr(e, "sqlstate", None)
    if state in ("40001", "40P01"):
        return "contention"        # documented: retry the transaction
    if state == "IK002":
        return "fenced"            # our claim was taken over: do not report success
    if state == "57014":
        return "other"             # statement_timeout: something hung
    if isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):
        return "lost"              # terminated backend, crashed or restarting server
    return "other"


class Claim:
    def __init__(self, row):
        (self.outcome, self.token, self.http_status, self.response_status,
         self.response_body, self.recovery_point, self.attempts) = row


class Session:
    """One client connection, reopened (until the server is back) when it is lost."""

    def __init__(self, run, name):
        self.run, self.name, self.conn = run, name, None

    def connect(self):
        while True:
            try:
                self.conn = psycopg.connect(
                    **self.run.conninfo, application_name=self.name, autocommit=True,
                    connect_timeout=5, options=f"-c statement_timeout={STATEMENT_TIMEOUT}")
                return
            except psycopg.OperationalError:
                if time.monotonic() > self.run.hard_deadline:
                    raise
                time.sleep(0.1)

    def reconnect(self):
        self.close()
        self.run.count("reconnects")
        self.connect()

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None


class Run:
    def __init__(self, args):
        self.args = args
        self.conninfo = dict(host=args.host, port=args.port, dbname=args.dbname,
                             user=os.environ.get("PGUSER", "postgres"))
        self.datadir = args.datadir
        tag = time.strftime("%m%d%H%M%S") + "-" + secrets.token_hex(3)
        self.app = f"idem-stress-{tag}"
        self.killable = f"{self.app}-c-"       # prefix of the sessions the fault thread kills
        self.scopes = {SAME_TX: f"stress/{tag}/{SAME_TX}",
                       COMMITTED_FIRST: f"stress/{tag}/{COMMITTED_FIRST}"}
        self.mode_of_scope = {v: k for k, v in self.scopes.items()}
        self.scope_list = list(self.scopes.values())

        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.answers = collections.defaultdict(list)     # (scope, key) -> [(status, body, who)]
        self.executions = collections.defaultdict(list)  # (scope, key) -> tokens whose commit we saw
        self.abandoned = []                              # ((scope, key), token, attempts, why)
        self.unexpected = []                             # undocumented answers and errors
        self.keys = []                                   # every key put in the working set
        self.window, self.slot = [], {}
        self.max_keys = args.keys * 200
        self.stop = threading.Event()
        self.crashed = False
        self.crash_error = None
        self.pre_crash_records = {}
        self.pre_crash_answers = {}

    # ---- shared bookkeeping -------------------------------------------------------------

    def count(self, name, n=1):
        with self.lock:
            self.counts[name] += n

    def note_unexpected(self, what):
        with self.lock:
            self.unexpected.append(what)

    def _new_key(self):
        i = len(self.keys)
        mode = SAME_TX if i % 2 == 0 else COMMITTED_FIRST
        sk = (self.scopes[mode], f"k{i:06d}")
        self.keys.append(sk)
        return sk

    def fill_window(self):
        for i in range(self.args.keys):
            sk = self._new_key()
            self.window.append(sk)
            self.slot[sk] = i

    def pick_key(self):
        with self.lock:
            return random.choice(self.window)

    def note_answer(self, sk, status, body, who):
        with self.lock:
            self.answers[sk].append((status, canon(body), who))
            if self.crashed:
                self.counts["answers after crash"] += 1
            if (len(self.answers[sk]) >= RETIRE_AFTER and sk in self.slot
                    and len(self.keys) < self.max_keys):
                i = self.slot.pop(sk)
                new = self._new_key()
                self.window[i] = new
                self.slot[new] = i

    def note_execution(self, sk, token, body, who):
        with self.lock:
            self.executions[sk].append(str(token))
        self.note_answer(sk, 201, body, who)

    def abandon(self, sk, token, attempts, why):
        with self.lock:
            self.abandoned.append((sk, str(token), attempts, why))

    def answered(self, sk, c, who):
        """A claim that did not go ahead. True when the client got its final answer."""
        if c.outcome == "replay":
            self.count("replays")
            if c.http_status != c.response_status:
                self.note_unexpected(f"{sk}: replay with http_status {c.http_status} "
                                     f"but response_status {c.response_status}")
            self.note_answer(sk, c.response_status, c.response_body, who)
            return True
        if c.outcome == "in_progress":
            self.count("409s")
            return False
        self.note_unexpected(f"{sk}: outcome {c.outcome!r} (http {c.http_status})")
        return True

    # ---- one operation ------------------------------------------------------------------

    def claim(self, conn, sk, lease):
        return Claim(conn.execute(CLAIM, (sk[0], sk[1], payload(sk[1]), TTL, lease)).fetchone())

    def operation(self, conn, sk, token, who, resumed_from):
        """The business write and the stored response, in the caller's transaction."""
        body = {"key": sk[1], "token": str(token), "by": who, "resumed_from": resumed_from}
        conn.execute("INSERT INTO stress.ledger (scope, key, token, by) VALUES (%s, %s, %s, %s)",
                     (sk[0], sk[1], token, who))
        conn.execute("SELECT idempotency.idem_complete(%s, %s, %s, 201, %s::jsonb)",
                     (sk[0], sk[1], token, json.dumps(body)))
        return body

    def same_tx(self, s, sk):
        conn = s.conn
        self.count("operations")
        body = None
        with conn.transaction():
            c = self.claim(conn, sk, None)
            if c.outcome in ("claimed", "reclaimed"):
                self.count("claims" if c.outcome == "claimed" else "takeovers")
                body = self.operation(conn, sk, c.token, s.name, c.recovery_point)
        if body is None:
            return self.answered(sk, c, s.name)
        self.note_execution(sk, c.token, body, s.name)
        return True

    def committed_first(self, s, sk, faults):
        conn = s.conn
        self.count("operations")
        c = self.claim(conn, sk, LEASE)          # autocommit: the claim commits on its own
        if c.outcome not in ("claimed", "reclaimed"):
            return self.answered(sk, c, s.name)
        self.count("claims" if c.outcome == "claimed" else "takeovers")
        try:
            if faults and random.random() < P_DIE:
                s.close()
                self.count("dead workers")
                self.abandon(sk, c.token, c.attempts, "dead worker")
                return True                      # a dead worker does not retry
            self.work(faults)
            conn.execute(CHECKPOINT, (sk[0], sk[1], c.token, "charged",
                                      json.dumps({"token": str(c.token)}), LEASE))
            self.work(faults)
            with conn.transaction():
                body = self.operation(conn, sk, c.token, s.name, c.recovery_point)
        except psycopg.Error as e:
            if classify(e) == "lost":
                self.abandon(sk, c.token, c.attempts, "session killed")
            raise
        self.note_execution(sk, c.token, body, s.name)
        return True

    def work(self, faults):
        if faults and random.random() < P_STALL:
            self.count("stalls")
            time.sleep(LEASE_S + 0.3)            # outlive the lease: a takeover may fence us
        else:
            time.sleep(random.uniform(0, 0.01))

    def drive_key(self, s, sk, faults, stop):
        """Retries one key until the client gets a final answer (or `stop` is set)."""
        failures = 0
        while not stop.is_set():
            try:
                if s.conn is None:
                    s.connect()
                if self.mode_of_scope[sk[0]] == SAME_TX:
                    done = self.same_tx(s, sk)
                else:
                    done = self.committed_first(s, sk, faults)
                if done:
                    return True
            except psycopg.Error as e:
                kind = classify(e)
                if kind == "lost":
                    s.reconnect()
                    continue
                if kind == "contention":
                    self.count("40001 retries")
                elif kind == "fenced":
                    self.count("fenced (IK002)")
                else:
                    self.note_unexpected(f"{sk}: {type(e).__name__} [{e.sqlstate}] {e}")
                    failures += 1
                    if failures >= 5:
                        return False
            time.sleep(random.uniform(0.02, 0.08))
        return False

    # ---- taken-over claims from idem_reclaim_stale ---------------------------------------

    def reclaim_once(self, s):
        """idem_reclaim_stale(release => false), then finish each claim it took over."""
        rows = s.conn.execute(RECLAIM, (LEASE,)).fetchall()   # autocommit: takeovers commit
        ours = [r for r in rows if r[0] in self.mode_of_scope]
        self.count("reclaimed by idem_reclaim_stale", len(ours))
        self.count("foreign rows reclaimed", len(rows) - len(ours))
        for i, (scope, key, token, _attempts, recovery_point) in enumerate(ours):
            sk = (scope, key)
            try:
                with s.conn.transaction():
                    body = self.operation(s.conn, sk, token, s.name, recovery_point)
            except psycopg.Error as e:
                kind = classify(e)
                if kind == "lost":
                    for r in ours[i:]:
                        self.abandon((r[0], r[1]), r[2], r[3], "completer killed")
                    raise
                if kind == "fenced":
                    self.count("fenced (IK002)")
                else:
                    self.note_unexpected(f"{sk}: completer: [{e.sqlstate}] {e}")
                continue
            self.note_execution(sk, token, body, s.name)
        return len(ours)

    # ---- threads ------------------------------------------------------------------------

    def client_loop(self, n):
        s = Session(self, f"{self.killable}w{n:02d}")
        try:
            while not self.stop.is_set():
                self.drive_key(s, self.pick_key(), True, self.stop)
        except Exception as e:
            self.note_unexpected(f"client {n} gave up: {type(e).__name__}: {e}")
        finally:
            s.close()

    def completer_loop(self):
        s = Session(self, f"{self.killable}completer")
        while not self.stop.wait(0.5):
            try:
                if s.conn is None:
                    s.connect()
                self.reclaim_once(s)
            except psycopg.Error as e:
                if classify(e) == "lost":
                    s.close()
                    self.count("reconnects")
                else:
                    self.note_unexpected(f"completer: [{e.sqlstate}] {e}")
        s.close()

    def fault_loop(self):
        s = Session(self, f"{self.app}-fault")
        crash_at = self.t0 + self.args.seconds / 2
        while not self.stop.wait(random.uniform(0.15, 0.45)):
            try:
                if not self.crashed and self.crash_error is None and time.monotonic() >= crash_at:
                    s.close()
                    self.crash()
                    continue
                if s.conn is None:
                    s.connect()
                killed = s.conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE %s AND pid <> pg_backend_pid() "
                    "ORDER BY random() LIMIT 1", (self.killable + "%",)).fetchone()
                if killed and killed[0]:
                    self.count("backends killed")
            except psycopg.Error:
                s.close()
            except Exception as e:
                self.note_unexpected(f"fault thread: {type(e).__name__}: {e}")
        s.close()

    # ---- the crash ----------------------------------------------------------------------

    def pg_ctl(self, *args):
        cmd = [os.path.join(self.bindir, "pg_ctl"), "-D", self.datadir, *args]
        if os.geteuid() == 0:
            owner = pwd.getpwuid(os.stat(self.datadir).st_uid).pw_name
            cmd = ["runuser", "-u", owner, "--"] + cmd
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def crash(self):
        # What must survive: every answer a client got, every completed record committed.
        with self.lock:
            self.pre_crash_answers = {sk: (a[0][0], a[0][1]) for sk, a in self.answers.items()}
        with psycopg.connect(**self.conninfo, application_name=f"{self.app}-snapshot") as conn:
            rows = conn.execute(
                "SELECT scope, key, token, response_status, response_body FROM idempotency.keys "
                "WHERE scope = ANY(%s) AND status = 'completed'", (self.scope_list,)).fetchall()
        self.pre_crash_records = {(r[0], r[1]): (str(r[2]), r[3], canon(r[4])) for r in rows}
        print(f"crash: {len(self.pre_crash_records)} completed records snapshotted, "
              f"pg_ctl stop -m immediate", flush=True)
        try:
            stop = self.pg_ctl("stop", "-m", "immediate", "-w")
        except subprocess.TimeoutExpired:
            self.crash_error = "pg_ctl stop timed out"
            return
        if stop.returncode != 0:
            self.crash_error = f"pg_ctl stop failed: {stop.stderr.strip()}"
            return
        self.crashed = True
        down = time.monotonic()
        try:
            start = self.pg_ctl("start", "-w", "-t", "60", "-l", self.logfile)
        except subprocess.TimeoutExpired:
            self.crash_error = "pg_ctl start timed out"
            return
        if start.returncode != 0:
            self.crash_error = f"pg_ctl start failed: {start.stderr.strip()}"
            return
        print(f"crash: server back after {time.monotonic() - down:.1f} s", flush=True)

    # ---- phases -------------------------------------------------------------------------

    def setup(self):
        with psycopg.connect(**self.conninfo, autocommit=True) as conn:
            datadir = conn.execute("SHOW data_directory").fetchone()[0]
            if os.path.realpath(datadir) != os.path.realpath(self.datadir):
                sys.exit(f"stress: the server runs from {datadir}, not {self.datadir}: "
                         f"refusing to crash it")
            conn.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
            conn.execute("DROP SCHEMA IF EXISTS stress CASCADE")
            conn.execute("CREATE SCHEMA stress")
            # No unique constraint on purpose: a second execution must show, not be refused.
            conn.execute("CREATE TABLE stress.ledger (id bigserial PRIMARY KEY, scope text NOT NULL, "
                         "key text NOT NULL, token uuid NOT NULL, by text NOT NULL, "
                         "at timestamptz NOT NULL DEFAULT clock_timestamp())")
        self.fill_window()

    def run_clients(self):
        self.t0 = time.monotonic()
        self.hard_deadline = self.t0 + self.args.seconds + 120
        threads = [threading.Thread(target=self.client_loop, args=(n,), daemon=True)
                   for n in range(self.args.sessions)]
        threads.append(threading.Thread(target=self.completer_loop, daemon=True))
        threads.append(threading.Thread(target=self.fault_loop, daemon=True))
        for t in threads:
            t.start()
        self.stop.wait(self.args.seconds)
        self.stop.set()
        for t in threads:
            t.join(timeout=max(1.0, self.hard_deadline - time.monotonic()))
            if t.is_alive():
                self.note_unexpected(f"thread {t.name} did not stop")
        self.elapsed = time.monotonic() - self.t0

    def pending(self, conn):
        done = {(r[0], r[1]) for r in conn.execute(
            "SELECT scope, key FROM idempotency.keys WHERE scope = ANY(%s) AND status = 'completed'",
            (self.scope_list,))}
        return [sk for sk in self.keys if sk not in done]

    def recover(self):
        """No more faults: reclaim stale claims and retry until every key is completed."""
        s = Session(self, f"{self.app}-recovery")
        self.hard_deadline = time.monotonic() + LEASE_S + RECOVERY_SECONDS + 30
        deadline = time.monotonic() + LEASE_S + RECOVERY_SECONDS
        s.connect()
        left = self.pending(s.conn)
        print(f"recovery: {len(left)} keys without a completed record", flush=True)
        while left and time.monotonic() < deadline:
            try:
                self.reclaim_once(s)
                # One attempt per key left: it claims a key nobody holds, answers 409 while
                # a lease runs, takes over a claim whose lease ended.
                for sk in self.pending(s.conn):
                    self.recovery_attempt(s, sk)
                left = self.pending(s.conn)
            except psycopg.Error as e:
                if classify(e) == "lost":
                    s.reconnect()
                else:
                    self.note_unexpected(f"recovery: [{e.sqlstate}] {e}")
            if left:
                time.sleep(0.3)
        s.close()

    def recovery_attempt(self, s, sk):
        try:
            if self.mode_of_scope[sk[0]] == SAME_TX:
                self.same_tx(s, sk)
            else:
                self.committed_first(s, sk, False)
        except psycopg.Error as e:
            kind = classify(e)
            if kind == "lost":
                raise
            if kind == "fenced":
                self.count("fenced (IK002)")
            elif kind == "contention":
                self.count("40001 retries")
            else:
                self.note_unexpected(f"{sk}: recovery: [{e.sqlstate}] {e}")

    # ---- checks -------------------------------------------------------------------------

    def check(self):
        with psycopg.connect(**self.conninfo) as conn:
            records = {(r[0], r[1]): dict(status=r[2], token=str(r[3]), attempts=r[4],
                                          response_status=r[5], body=r[6])
                       for r in conn.execute(
                           "SELECT scope, key, status, token, attempts, response_status, response_body "
                           "FROM idempotency.keys WHERE scope = ANY(%s) AND expires_at > now()",
                           (self.scope_list,))}
            ledger = conn.execute("SELECT scope, key, token::text FROM stress.ledger").fetchall()

        ledger_by_key = collections.defaultdict(list)
        ledger_by_token = collections.Counter()
        for scope, key, token in ledger:
            ledger_by_key[(scope, key)].append(token)
            ledger_by_token[token] += 1

        results = []

        # 1. No operation ran twice.
        bad = []
        for sk, tokens in ledger_by_key.items():
            if len(tokens) > 1:
                bad.append(f"{sk}: {len(tokens)} ledger rows {tokens}")
        for token, n in ledger_by_token.items():
            if n > 1:
                bad.append(f"token {token}: {n} ledger rows")
        for sk, tokens in self.executions.items():
            if len(tokens) > 1:
                bad.append(f"{sk}: clients saw {len(tokens)} executions commit {tokens}")
        self.duplicates = (sum(len(t) - 1 for t in ledger_by_key.values() if len(t) > 1)
                           + sum(len(t) - 1 for t in self.executions.values() if len(t) > 1))
        results.append(("no key's operation ran twice; at most one ledger row per key", bad))

        # 2. Ledger and stored responses agree.
        bad = []
        for sk, rec in records.items():
            if rec["status"] != "completed":
                continue
            rows = ledger_by_key.get(sk, [])
            body_token = (rec["body"] or {}).get("token")
            if len(rows) != 1:
                bad.append(f"{sk}: completed with {len(rows)} ledger rows")
            elif not (rows[0] == body_token == rec["token"]):
                bad.append(f"{sk}: ledger token {rows[0]}, body token {body_token}, "
                           f"record token {rec['token']}")
        for sk in ledger_by_key:
            if records.get(sk, {}).get("status") != "completed":
                bad.append(f"{sk}: ledger row without a completed record")
        results.append(("every completed key has one ledger row, with the token in its response", bad))

        # 3. Every answer a client got is the stored one.
        bad = list(self.unexpected)
        for sk, got in self.answers.items():
            rec = records.get(sk)
            if rec is None or rec["status"] != "completed":
                bad.append(f"{sk}: clients got {len(got)} answers but no completed record remains")
                continue
            stored = (rec["response_status"], canon(rec["body"]))
            for status, body, who in got:
                if (status, body) != stored:
                    bad.append(f"{sk}: {who} got {status} {body}, stored {stored[0]} {stored[1]}")
        results.append(("every 2xx answer for a key is identical to the stored response", bad))

        # 4. Nothing completed before the crash was lost or changed.
        bad = []
        if not self.crashed or self.crash_error:
            bad.append(f"the server was not crashed and restarted: {self.crash_error or 'run too short'}")
        for sk, (token, status, body) in self.pre_crash_records.items():
            rec = records.get(sk)
            if rec is None or (rec["token"], rec["response_status"], canon(rec["body"])) != (token, status, body):
                bad.append(f"{sk}: completed before the crash as {token} {status} {body}, now {rec}")
        for sk, (status, body) in self.pre_crash_answers.items():
            rec = records.get(sk)
            if rec is None or (rec["response_status"], canon(rec["body"])) != (status, body):
                bad.append(f"{sk}: answered {status} {body} before the crash, now {rec}")
        results.append(("no completed record seen before the crash was lost or changed", bad))

        # 5. Every claim left in_progress was recovered; none remains.
        bad = []
        self.recovered_takeovers = 0
        for sk, token, attempts, why in self.abandoned:
            rec = records.get(sk)
            if rec is None or rec["status"] != "completed":
                bad.append(f"{sk}: left in_progress ({why}, token {token}) and not recovered: {rec}")
            elif rec["token"] != token:
                if rec["attempts"] <= attempts:
                    bad.append(f"{sk}: completed by {rec['token']} with attempts {rec['attempts']}, "
                               f"but {token} ({why}) already had attempts {attempts}")
                else:
                    self.recovered_takeovers += 1
            # else: the session died after its own idem_complete had committed
        for sk, rec in records.items():
            if rec["status"] != "completed":
                bad.append(f"{sk}: still {rec['status']} at the end")
        missing = [sk for sk in self.keys if sk not in records]
        if missing:
            bad.append(f"{len(missing)} keys have no record at all, e.g. {missing[:5]}")
        results.append(("every abandoned in_progress claim was recovered; none remains", bad))
        return results

    def report(self, results):
        c = self.counts
        crashes = 1 if self.crashed and not self.crash_error and c["answers after crash"] > 0 else 0
        print(f"sessions:                         {self.args.sessions}")
        print(f"seconds:                          {self.elapsed:.1f}")
        print(f"keys used:                        {len(self.keys)} (working set {self.args.keys})")
        print(f"operations attempted:             {c['operations']}")
        print(f"claims:                           {c['claims']}")
        print(f"replays:                          {c['replays']}")
        print(f"409s:                             {c['409s']}")
        print(f"40001 retries:                    {c['40001 retries']}")
        print(f"fenced by token (IK002):          {c['fenced (IK002)']}")
        print(f"dead workers / stalls:            {c['dead workers']} / {c['stalls']}")
        print(f"backends killed:                  {c['backends killed']}")
        print(f"crashes survived:                 {crashes}")
        print(f"reconnects:                       {c['reconnects']}")
        print(f"takeovers (idem_claim reclaimed): {c['takeovers']}")
        print(f"reclaimed by idem_reclaim_stale:  {c['reclaimed by idem_reclaim_stale']}")
        if c["foreign rows reclaimed"]:
            print(f"other scopes' stale claims taken: {c['foreign rows reclaimed']} (left in_progress)")
        print(f"abandoned claims recovered:       {self.recovered_takeovers} of {len(self.abandoned)} abandoned")
        print(f"duplicates found:                 {self.duplicates}")
        passed = failed = 0
        for n, (title, bad) in enumerate(results, 1):
            if bad:
                failed += 1
                print(f"FAIL {n}. {title}: {len(bad)} violations")
                for line in bad[:15]:
                    print(f"    {line}")
            else:
                passed += 1
                print(f"ok   {n}. {title}")
        print(f"stress: {passed} passed, {failed} failed")
        return failed


def data_directory(path):
    if os.path.isfile(os.path.join(path, "PG_VERSION")):
        return path
    if os.path.isfile(os.path.join(path, "data", "PG_VERSION")):
        return os.path.join(path, "data")
    sys.exit(f"stress: {path} is not a PostgreSQL data directory")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", required=True, help="127.0.0.1 or a unix socket directory")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--datadir", required=True, help="the server's data directory (crashed once)")
    p.add_argument("--logfile", help="server log for pg_ctl start (default: DATADIR/../server.log)")
    p.add_argument("--bindir", default=DEFAULT_BINDIR,
                   help="the server's bin directory, for pg_ctl (default: $PGBIN, else Debian's PostgreSQL 15)")
    p.add_argument("--dbname", default=os.environ.get("PGDATABASE", "postgres"))
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--keys", type=int, default=300)
    p.add_argument("--send-seconds", type=float, default=8, help="the sending phase (0: none)")
    p.add_argument("--senders", type=int, default=24, help="sender sessions of the sending phase")
    args = p.parse_args()
    if args.sessions < 1 or args.keys < 2 or args.seconds <= 0:
        sys.exit("stress: --sessions, --keys and --seconds must be positive (keys at least 2)")
    args.datadir = data_directory(args.datadir)

    run = Run(args)
    run.bindir = args.bindir
    if not os.access(os.path.join(run.bindir, "pg_ctl"), os.X_OK):
        sys.exit(f"stress: no pg_ctl in {run.bindir} (--bindir)")
    run.logfile = args.logfile or os.path.join(os.path.dirname(os.path.abspath(args.datadir)), "server.log")
    # A last resort against a hang: everything has its own bound well inside this one.
    watchdog = threading.Timer(args.seconds + LEASE_S + RECOVERY_SECONDS + 300 + args.send_seconds
                               + senders.DRAIN_SECONDS,
                               lambda: (print("stress: watchdog expired\nstress: 0 passed, 5 failed",
                                              flush=True), os._exit(1)))
    watchdog.daemon = True
    watchdog.start()

    run.setup()
    print(f"stress: {args.sessions} sessions, {args.seconds:g} s, working set {args.keys} keys, "
          f"scopes {run.scope_list}", flush=True)
    try:
        run.run_clients()
        run.recover()
        results = run.check()
        if args.send_seconds > 0:
            print(f"stress: the sending phase, {args.senders} senders, {args.send_seconds:g} s", flush=True)
            results += senders.run(run.conninfo, args.send_seconds, args.senders, tag=run.app)
        failed = run.report(results)
    except Exception as e:
        # e.g. the server did not come back after the crash
        print(f"stress: aborted: {type(e).__name__}: {e}")
        print("stress: 0 passed, 5 failed")
        failed = 5
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
