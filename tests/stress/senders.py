"""The sending side under stress, for tests/stress/stress.py: many senders on few targets.

Producer threads record new sends (idem_send) all phase long; sender threads (one psycopg
connection each, autocommit, as the packages run them) take due sends with idem_send_next and
record what a simulated receiver answers with idem_send_result. The receiver of each target
is down (503) for a stretch of the phase, at a different time for each target, and a third
target answers 503 to one request in ten throughout. Then the receivers are up and the senders
go on until every send is done. The retry window is short (send_retry_window = 6 s), so that
the budget's counts roll over several times during the phase, and the budget 0.5, so that
retries go out often while first attempts keep coming: against 0.5.0's send.sql this run meets
its deadlock (two dozen 40P01 in 8 s).

Checks: no deadlock (pg_stat_database.deadlocks unchanged, no 40P01 seen by any sender), every
send ends done with no unexpected error, and while a target's receiver was down its retries
over the window stayed within floor(send_retry_budget x first attempts + 10).
Nothing is killed in this phase: a deadlock, not a lost connection, is what it looks for.
"""

import collections
import random
import threading
import time

import psycopg

WINDOW_S = 6.0
RATIO = 0.5
SETTINGS = (f"-c idempotency.send_retry_window={WINDOW_S:g}s -c idempotency.send_retry_budget={RATIO:g} "
            "-c idempotency.send_backoff_base=20ms "
            "-c idempotency.send_backoff_cap=500ms -c statement_timeout=30s")
BATCH = 8
DRAIN_SECONDS = 60


class Receiver:
    """What the simulated receiver of each target answers at a moment of the phase."""

    def __init__(self, targets, seconds):
        self.t0 = None
        # Targets 0 and 1: down for a third of the phase each, one after the other.
        self.outages = {targets[0]: (0.2 * seconds, 0.5 * seconds), targets[1]: (0.45 * seconds, 0.75 * seconds)}
        self.flaky = set(targets[2:])
        self.up = threading.Event()         # set: every receiver answers (the drain)

    def down(self, target, at):
        if self.up.is_set() or target not in self.outages:
            return False
        start, end = self.outages[target]
        return start <= at - self.t0 < end

    def answer(self, target):
        if self.down(target, time.monotonic()):
            return 503
        if target in self.flaky and not self.up.is_set() and random.random() < 0.1:
            return 503
        return 201


class SendStress:
    def __init__(self, conninfo, seconds, senders, targets, tag):
        self.conninfo, self.seconds, self.senders = conninfo, seconds, senders
        self.scope = f"stress-send/{tag}"
        self.targets = [f"{self.scope}/t{i}" for i in range(targets)]
        self.receiver = Receiver(self.targets, seconds)
        self.stop_producing = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.handed = []            # (target, transaction now() as epoch, attempt)
        self.deadlocks_seen = []
        self.unexpected = []
        self.produced = 0

    def connect(self):
        return psycopg.connect(**self.conninfo, autocommit=True, options=SETTINGS,
                               application_name="idem-stress-sender")

    def note(self, what):
        with self.lock:
            self.unexpected.append(what)

    def producer(self, n):
        with self.connect() as conn:
            i = 0
            while not self.stop_producing.is_set():
                with conn.transaction():
                    for _ in range(5):
                        target = self.targets[i % len(self.targets)]
                        conn.execute("SELECT idempotency.idem_send(%s, %s, %s, %s::jsonb)",
                                     (self.scope, f"p{n}-{i}", target, '{"amount": 1}'))
                        i += 1
                with self.lock:
                    self.produced += 5
                time.sleep(0.02)

    def sender(self, n):
        conn = self.connect()
        try:
            while not self.stop.is_set():
                # Most senders serve one target, some every target (target NULL).
                target = None if n % 4 == 3 else self.targets[n % len(self.targets)]
                try:
                    rows = conn.execute(
                        "SELECT extract(epoch FROM now()), n.scope, n.operation, n.target, n.attempt, n.token "
                        "FROM idempotency.idem_send_next(%s, %s, '5 seconds') AS n", (target, BATCH)).fetchall()
                    for at, scope, operation, tgt, attempt, token in rows:
                        with self.lock:
                            self.handed.append((tgt, float(at), attempt))
                            self.counts["attempts"] += 1
                            self.counts["retries" if attempt > 1 else "first attempts"] += 1
                        status = self.receiver.answer(tgt)
                        conn.execute("SELECT idempotency.idem_send_result(%s, %s, %s, %s)",
                                     (scope, operation, token, status))
                except psycopg.Error as e:
                    if e.sqlstate == "40P01":
                        with self.lock:
                            self.deadlocks_seen.append(str(e).splitlines()[0])
                    else:
                        self.note(f"sender {n}: [{e.sqlstate}] {str(e).splitlines()[0]}")
                    continue
                if not rows:
                    time.sleep(random.uniform(0.005, 0.03))
        finally:
            conn.close()

    def deadlocks(self, conn):
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]

    def left(self, conn):
        return conn.execute("SELECT count(*) FROM idempotency.outbound WHERE scope = %s AND state <> 'done'",
                            (self.scope,)).fetchone()[0]

    def run(self):
        with self.connect() as conn:
            deadlocks_before = self.deadlocks(conn)
            self.receiver.t0 = time.monotonic()
            self.t0_db = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
        producers = [threading.Thread(target=self.producer, args=(n,), daemon=True) for n in range(2)]
        threads = [threading.Thread(target=self.sender, args=(n,), daemon=True) for n in range(self.senders)]
        for t in producers + threads:
            t.start()
        time.sleep(self.seconds)
        self.stop_producing.set()
        for t in producers:
            t.join(timeout=60)
        self.receiver.up.set()
        drain_started = time.monotonic()
        with self.connect() as conn:
            while self.left(conn) and time.monotonic() < drain_started + DRAIN_SECONDS:
                time.sleep(0.2)
            self.drain_seconds = time.monotonic() - drain_started
            self.stop.set()
            for t in threads:
                t.join(timeout=60)
                if t.is_alive():
                    self.note(f"thread {t.name} did not stop")
            # Backends flush their statistics when they end; give the last ones a moment.
            time.sleep(1.5)
            self.deadlock_count = self.deadlocks(conn) - deadlocks_before
            self.states = dict(conn.execute(
                "SELECT state, count(*) FROM idempotency.outbound WHERE scope = %s GROUP BY state",
                (self.scope,)).fetchall())

    def bound_violations(self):
        """Retries handed out while the target's receiver was down (from 1 s into the outage, when
        every answer in flight before it has been recorded) over the window before each: within
        floor(RATIO x first attempts + 10)."""
        bad = []
        by_target = collections.defaultdict(list)
        for target, at, attempt in self.handed:
            by_target[target].append((at, attempt))
        for target, (start, end) in self.receiver.outages.items():
            rows = sorted(by_target[target])
            for at, attempt in rows:
                if attempt == 1 or not (self.t0_db + start + 1 <= at < self.t0_db + end):
                    continue
                window = [a for t, a in rows if at - WINDOW_S < t <= at]
                retries = sum(1 for a in window if a > 1)
                firsts = sum(1 for a in window if a == 1)
                if retries > int(RATIO * firsts + 10):
                    bad.append(f"{target}: {retries} retries over the {WINDOW_S:g} s before {at:.3f}, "
                               f"bound {int(RATIO * firsts + 10)} ({firsts} first attempts)")
        return bad

    def results(self):
        c = self.counts
        print(f"senders:                          {self.senders} on {len(self.targets)} targets, "
              f"{self.seconds:g} s, window {WINDOW_S:g} s")
        print(f"sends recorded / attempts:        {self.produced} / {c['attempts']} "
              f"({c['retries']} retries)")
        print(f"drained after the receivers were up: {self.drain_seconds:.1f} s, states {self.states}")
        print(f"deadlocks (pg_stat_database):     {self.deadlock_count}")
        results = []
        bad = [f"pg_stat_database.deadlocks grew by {self.deadlock_count}"] if self.deadlock_count else []
        bad += [f"a sender saw 40P01: {d}" for d in self.deadlocks_seen[:10]]
        results.append((f"senders: no deadlock among {self.senders} senders on {len(self.targets)} targets", bad))
        bad = list(self.unexpected)
        if set(self.states) != {"done"} or self.states.get("done") != self.produced:
            bad.append(f"{self.produced} sends recorded, states at the end {self.states}")
        results.append(("senders: every send ended done, no unexpected error", bad))
        results.append(("senders: while a receiver was down its retries stayed within the budget",
                        self.bound_violations()))
        return results


def run(conninfo, seconds, senders=24, targets=3, tag="run"):
    """The phase; returns its checks as (title, violations)."""
    stress = SendStress(conninfo, seconds, senders, targets, tag)
    stress.run()
    return stress.results()
