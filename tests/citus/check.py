#!/usr/bin/python3
"""The idempotency extension on Citus, checked through the coordinator.

    /usr/bin/python3 tests/citus/check.py --coordinator CONNINFO --worker CONNINFO --worker CONNINFO

Run by tests/citus/run.sh, which starts a coordinator and two workers on loopback, creates
the extension on each and calls idempotency.distribute(). Prints one line per check
("ok   ..." or "FAIL ...: why") and last "summary passed=N failed=M" (run.sh turns it
into its closing line); exits 1 on a failure.

Sections:
  distribution   both tables hash-distributed by scope and colocated; the scope-first
                 functions delegated; two scopes stored on two different workers
  contract       every outcome and SQLSTATE through the coordinator, once as single calls
                 in autocommit (delegated to the worker) and once inside a transaction
                 block (run on the coordinator, statements routed to the worker)
  null scope     a NULL scope gives 22004 from every scope-first function, as a literal and
                 as a bound parameter, and the coordinator does not restart; the list of
                 scope-first functions checked is the installed extension's (pg_proc)
  settings       session settings in both paths; ALTER ROLE ... SET reaches the workers
  concurrency    20 connections claim one key at once: exactly one claimed
  maintenance    idem_sweep / idem_sweep_all / idem_reclaim_stale across both workers, and
                 neither ever deletes or takes over a record that a claim is replacing
  repeated calls idem_sweep(1) / idem_reclaim_stale(1) over and over in one session (past
                 the switch to generic plans): budget, every shard, the fence
  mixed          one key claimed at once in transaction blocks (on the coordinator) and in
                 autocommit (delegated): one claimed, no 23505
  partitions     periods distributed and colocated, records moved from the far partition,
                 periods that ended dropped with their shards
"""

import argparse
import threading
import time
import uuid

import psycopg
import psycopg.sql
from psycopg.types.json import Jsonb

passed = 0
failed = 0

# Why a check fails on a build that still has the single-server statements / no guard.
NEEDS_REPLACEMENT = ("needs the Citus-safe sweep/reclaim statements: this build runs "
                     "SELECT ... FOR UPDATE SKIP LOCKED across shards (Citus: 0A000)")
NEEDS_GUARD = ("needs the NULL-scope guard (idempotency.idem_scope_support attached to the "
               "scope-first functions): without it distribute() does not delegate")

SCOPE_FIRST = {  # the scope-first functions, called with a scope of %s
    "idem_claim": "idempotency.idem_claim(%s, 'k')",
    "idem_complete": "idempotency.idem_complete(%s, 'k', '00000000-0000-0000-0000-000000000000', 200)",
    "idem_checkpoint": "idempotency.idem_checkpoint(%s, 'k', '00000000-0000-0000-0000-000000000000', 'p')",
    "idem_release": "idempotency.idem_release(%s, 'k', '00000000-0000-0000-0000-000000000000')",
    "idem_lookup": "idempotency.idem_lookup(%s, 'k')",
    "idem_seen": "idempotency.idem_seen(%s, 'm')",
    "idem_seen_many": "idempotency.idem_seen_many(%s, ARRAY['m'])",
}


# The scope-first functions of the receiving side as the installed extension has them (the
# sending side's, idem_send and idem_send_result, stay on the coordinator: section sending).
SENDING_SIDE = "p.proname NOT LIKE 'idem\\_send%'"
SCOPE_FIRST_INSTALLED = ("SELECT DISTINCT p.proname FROM pg_proc p "
                         "WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proargnames[1] = 'scope' "
                         f"AND {SENDING_SIDE}")


def check(name, ok, why="", needs=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}", flush=True)
    else:
        failed += 1
        extra = f" [{needs}]" if needs else ""
        print(f"FAIL {name}: {why}{extra}", flush=True)


def sqlstate_of(conn, sql, params=None):
    """None when the statement succeeds, else its SQLSTATE."""
    try:
        conn.execute(sql, params)
        return None
    except psycopg.errors.DatabaseError as e:
        if isinstance(e, psycopg.OperationalError) and e.sqlstate is None:
            raise
        return e.sqlstate


def connect(conninfo, **kw):
    return psycopg.connect(conninfo, autocommit=True, **kw)


class Cluster:
    def __init__(self, coordinator, workers):
        self.coord_info = coordinator
        self.worker_infos = workers
        self.c = connect(coordinator)
        self.tag = uuid.uuid4().hex[:8]
        # node port -> conninfo of that worker
        self.workers = {}
        for info in workers:
            with connect(info) as w:
                self.workers[w.execute("SELECT current_setting('port')::int").fetchone()[0]] = info

    def node_of(self, scope, table="idempotency.keys"):
        """Port of the worker that holds the shard of scope."""
        return self.c.execute(
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) "
            "WHERE p.shardid = get_shard_id_for_distribution_column(%s::regclass, %s::text)",
            (table, scope)).fetchone()[0]

    def scopes_on_each_worker(self, prefix, per_worker):
        """per_worker scopes held by each worker: {port: [scope, ...]}."""
        found = {port: [] for port in self.workers}
        i = 0
        while any(len(v) < per_worker for v in found.values()):
            scope = f"{prefix}-{self.tag}-{i}"
            port = self.node_of(scope)
            if port in found and len(found[port]) < per_worker:
                found[port].append(scope)
            i += 1
        return found

    def scope(self, name):
        return f"{name}-{self.tag}"


def pushed_down(conn, sql, params=None):
    """Runs sql with client_min_messages = debug1; True when Citus delegated the call."""
    notes = []

    def handler(d):
        notes.append(d.message_primary or "")

    conn.add_notice_handler(handler)
    try:
        conn.execute("SET client_min_messages = debug1")
        try:
            conn.execute(sql, params).fetchall()
        except psycopg.errors.DatabaseError as e:  # IK002 and such: the notice came first
            if isinstance(e, psycopg.OperationalError) and e.sqlstate is None:
                raise
    finally:
        conn.execute("RESET client_min_messages")
        conn.remove_notice_handler(handler)
    return any("pushing down the function call" in n for n in notes)


# ---------------------------------------------------------------------------------------

def distribution(cl):
    rows = cl.c.execute(
        "SELECT logicalrelid::text, partmethod, column_to_column_name(logicalrelid, partkey), colocationid "
        "FROM pg_dist_partition WHERE logicalrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass) "
        "ORDER BY 1").fetchall()
    check("keys and messages are hash-distributed by scope",
          [(r[0], r[1], r[2]) for r in rows]
          == [("idempotency.keys", "h", "scope"), ("idempotency.messages", "h", "scope")],
          f"pg_dist_partition has {rows}")
    check("keys and messages are colocated", len(rows) == 2 and rows[0][3] == rows[1][3], f"{rows}")

    delegated = cl.c.execute(
        "SELECT p.proname::text, d.distribution_argument_index, "
        "       d.colocationid = (SELECT colocationid FROM pg_dist_partition "
        "                         WHERE logicalrelid = 'idempotency.keys'::regclass) "
        "FROM pg_proc p LEFT JOIN pg_dist_object d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid "
        "WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proargnames[1] = 'scope' "
        f"AND {SENDING_SIDE} ORDER BY 1").fetchall()
    check(f"the {len(SCOPE_FIRST)} scope-first functions checked here are delegated by scope, colocated "
          "with the tables",
          sorted(r[0] for r in delegated) == sorted(SCOPE_FIRST) and all(r[1] == 0 and r[2] for r in delegated),
          f"{delegated}", NEEDS_GUARD)

    on = cl.scopes_on_each_worker("place", 1)
    (p1, (s1,)), (p2, (s2,)) = sorted(on.items())
    for s in (s1, s2):
        cl.c.execute("SELECT idempotency.idem_claim(%s, 'k')", (s,))
    seen = {}
    for port, info in cl.workers.items():
        with connect(info) as w:
            for s in (s1, s2):
                shard = cl.c.execute("SELECT shard_name('idempotency.keys', "
                                     "get_shard_id_for_distribution_column('idempotency.keys', %s::text))",
                                     (s,)).fetchone()[0]
                exists = w.execute("SELECT to_regclass(%s) IS NOT NULL", (shard,)).fetchone()[0]
                n = w.execute(f"SELECT count(*) FROM {shard} WHERE scope = %s", (s,)).fetchone()[0] if exists else 0
                seen[(port, s)] = n
    check(f"two scopes land on different workers ({s1} on {p1}, {s2} on {p2}), each row only there",
          seen == {(p1, s1): 1, (p1, s2): 0, (p2, s1): 0, (p2, s2): 1}, f"rows per (worker, scope): {seen}")


def contract(cl, path):
    """path 'autocommit': one call per statement (delegated); 'transaction': inside BEGIN/COMMIT."""
    c = cl.c
    s = cl.scope(f"contract-{path}")
    label = f"[{path}]"

    def call(sql, params=None):
        if path == "transaction":
            with c.transaction():
                return c.execute(sql, params).fetchall()
        return c.execute(sql, params).fetchall()

    def state(sql, params=None):
        if path == "transaction":
            try:
                with c.transaction():
                    c.execute(sql, params)
                return None
            except psycopg.errors.DatabaseError as e:
                return e.sqlstate
        return sqlstate_of(c, sql, params)

    if path == "autocommit":
        not_pushed = [name for name, expr in SCOPE_FIRST.items()
                      if not pushed_down(c, "SELECT " + expr, (s,))]
        check(f"{label} a single call of each scope-first function is delegated to the worker",
              not not_pushed, f"not delegated: {not_pushed}", NEEDS_GUARD)

    r = call("SELECT outcome, token, http_status, attempts FROM idempotency.idem_claim(%s, 'k1', 'fp1')", (s,))[0]
    check(f"{label} claimed", r[0] == "claimed" and r[1] is not None and r[2] is None and r[3] == 1, f"{r}")
    tok = r[1]
    r = call("SELECT outcome, token, http_status FROM idempotency.idem_claim(%s, 'k1', 'fp1')", (s,))[0]
    check(f"{label} in_progress (409, no token)", r == ("in_progress", None, 409), f"{r}")
    r = call("SELECT outcome, http_status FROM idempotency.idem_claim(%s, 'k1', 'fp2')", (s,))[0]
    check(f"{label} mismatch (422)", r == ("mismatch", 422), f"{r}")
    r = call("SELECT idempotency.idem_checkpoint(%s, 'k1', %s, 'step1', %s) > now()", (s, tok, Jsonb({"a": 1})))[0]
    check(f"{label} checkpoint with the owner's token renews the lease", r == (True,), f"{r}")
    st = state("SELECT idempotency.idem_checkpoint(%s, 'k1', %s, 'x')", (s, uuid.uuid4()))
    check(f"{label} checkpoint with another token: IK002", st == "IK002", f"got {st}")
    st = state("SELECT idempotency.idem_complete(%s, 'k1', %s, 201)", (s, uuid.uuid4()))
    check(f"{label} complete with another token: IK002", st == "IK002", f"got {st}")
    st = state("SELECT idempotency.idem_complete(%s, 'never-claimed', %s, 201)", (s, uuid.uuid4()))
    check(f"{label} complete of an unknown key: IK001", st == "IK001", f"got {st}")
    st = state("SELECT idempotency.idem_complete(%s, 'k1', %s, 201, %s, %s)",
               (s, tok, Jsonb({"id": "ch_1"}), Jsonb({"Location": "/charges/ch_1"})))
    check(f"{label} complete with the owner's token", st is None, f"got {st}")
    st = state("SELECT idempotency.idem_complete(%s, 'k1', %s, 201)", (s, tok))
    check(f"{label} complete again: IK003", st == "IK003", f"got {st}")
    st = state("SELECT idempotency.idem_checkpoint(%s, 'k1', %s, 'late')", (s, tok))
    check(f"{label} checkpoint after completion: IK003", st == "IK003", f"got {st}")
    r = call("SELECT outcome, http_status, response_status, response_body, response_headers "
             "FROM idempotency.idem_claim(%s, 'k1', 'fp1')", (s,))[0]
    check(f"{label} replay of the stored response",
          r == ("replay", 201, 201, {"id": "ch_1"}, {"Location": "/charges/ch_1"}), f"{r}")
    r = call("SELECT key, status, response_status FROM idempotency.idem_lookup(%s, 'k1')", (s,))
    check(f"{label} lookup returns the live record", r == [("k1", "completed", 201)], f"{r}")
    r = call("SELECT count(*) FROM idempotency.idem_lookup(%s, 'nothing-here')", (s,))
    check(f"{label} lookup of an unknown key returns no row", r == [(0,)], f"{r}")

    tok2 = call("SELECT token FROM idempotency.idem_claim(%s, 'k2')", (s,))[0][0]
    r = call("SELECT idempotency.idem_release(%s, 'k2', %s)", (s, uuid.uuid4()))
    check(f"{label} release with another token: false", r == [(False,)], f"{r}")
    r = call("SELECT idempotency.idem_release(%s, 'k2', %s)", (s, tok2))
    check(f"{label} release with the owner's token: true", r == [(True,)], f"{r}")
    r = call("SELECT outcome FROM idempotency.idem_claim(%s, 'k2')", (s,))
    check(f"{label} a released key is claimed anew", r == [("claimed",)], f"{r}")

    tok3 = call("SELECT token FROM idempotency.idem_claim(%s, 'k3', lease => '1 ms')", (s,))[0][0]
    call("SELECT idempotency.idem_checkpoint(%s, 'k3', %s, 'half-way', %s, lease => '1 ms')",
         (s, tok3, Jsonb({"n": 1})))
    time.sleep(0.05)
    r = call("SELECT outcome, token <> %s, attempts, recovery_point, recovery_data "
             "FROM idempotency.idem_claim(%s, 'k3')", (tok3, s))[0]
    check(f"{label} reclaimed after the lease ended, with the checkpoint",
          r == ("reclaimed", True, 2, "half-way", {"n": 1}), f"{r}")
    st = state("SELECT idempotency.idem_complete(%s, 'k3', %s, 200)", (s, tok3))
    check(f"{label} the old owner's late complete: IK002", st == "IK002", f"got {st}")

    call("SELECT idempotency.idem_claim(%s, 'k4', 'old', ttl => '1 ms')", (s,))
    time.sleep(0.05)
    r = call("SELECT outcome, attempts FROM idempotency.idem_claim(%s, 'k4', 'new')", (s,))[0]
    check(f"{label} an expired record is replaced (claimed, attempts 1)", r == ("claimed", 1), f"{r}")

    r = call("SELECT idempotency.idem_seen(%s, 'm1')", (s,)) + call("SELECT idempotency.idem_seen(%s, 'm1')", (s,))
    check(f"{label} seen: true the first time, false for a duplicate", r == [(True,), (False,)], f"{r}")
    st = state("SELECT idempotency.idem_claim(%s, '')", (s,))
    check(f"{label} an empty key: 22023", st == "22023", f"got {st}")

    st = state("SELECT idempotency.idem_seen_many(%s, ARRAY['ok', NULL])", (s,))
    check(f"{label} seen_many with a NULL message id: 22004", st == "22004", f"got {st}")
    try:  # a batch that writes; an error here is reported, and the checks after it still run
        r = call("SELECT idempotency.idem_seen_many(%s, ARRAY['b1', 'm1', 'b2', 'b1'])", (s,))
        check(f"{label} seen_many: true for each first sighting in the batch, false for m1 (seen) and the "
              "repeated b1", r == [([True, False, True, False],)], f"{r}")
        r = call("SELECT idempotency.idem_seen_many(%s, ARRAY['b2', 'b3'])", (s,))
        check(f"{label} seen_many again: false for b2 (an earlier batch), true for b3", r == [([False, True],)],
              f"{r}")
    except psycopg.errors.DatabaseError as e:
        check(f"{label} seen_many records a batch", False, f"{e.sqlstate}: {e}".replace("\n", " "))


def null_scope(cl):
    c = cl.c
    installed = sorted(r[0] for r in c.execute(SCOPE_FIRST_INSTALLED).fetchall())
    check("every installed function whose first argument is scope is checked here (pg_proc)",
          installed == sorted(SCOPE_FIRST), f"installed {installed}, checked {sorted(SCOPE_FIRST)}")
    started = c.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    bad = []
    for name, expr in SCOPE_FIRST.items():
        for form, sql, params in (("literal", "SELECT " + expr % "NULL", None),
                                  ("FROM", "SELECT * FROM " + expr % "NULL", None),
                                  ("parameter", "SELECT " + expr, (None,))):
            try:
                st = sqlstate_of(c, sql, params)
            except psycopg.OperationalError as e:
                check("a NULL scope does not crash the coordinator", False,
                      f"{name} ({form}) lost the connection: {e}".replace("\n", " "))
                time.sleep(5)
                cl.c = connect(cl.coord_info)
                return
            if st != "22004":
                bad.append((name, form, st))
    check("a NULL scope gives 22004 from every scope-first function (literal, FROM, bound parameter)",
          not bad, f"{bad}")
    now = c.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    check("the coordinator did not restart", now == started, f"started {started}, now {now}")


def settings(cl):
    c = cl.c
    s = cl.scope("settings")
    c.execute("SET idempotency.default_ttl = '1h'")
    try:
        with c.transaction():
            r = c.execute("SELECT expires_at - now() FROM idempotency.idem_claim(%s, 'tx')", (s,)).fetchone()[0]
        check("in a transaction block (run on the coordinator) the session's default_ttl applies",
              str(r) == "1:00:00", f"ttl {r}")
        r = c.execute("SELECT expires_at - now() FROM idempotency.idem_claim(%s, 'auto')", (s,)).fetchone()[0]
        delegated = pushed_down(c, "SELECT outcome FROM idempotency.idem_claim(%s, 'auto2')", (s,))
        print(f"info a single call {'(delegated)' if delegated else '(not delegated)'} with SET "
              f"idempotency.default_ttl = '1h' in the session stored a ttl of {r}", flush=True)
    finally:
        c.execute("RESET idempotency.default_ttl")
    c.execute("ALTER ROLE postgres SET idempotency.default_lease = '7min'")
    try:
        got = {}
        for port, info in cl.workers.items():
            with connect(info) as w:
                got[port] = w.execute(
                    "SELECT array_to_string(setconfig, ',') FROM pg_db_role_setting "
                    "WHERE setrole = 'postgres'::regrole AND setdatabase = 0").fetchone()
        check("ALTER ROLE ... SET on the coordinator reaches every worker",
              all(v == ("idempotency.default_lease=7min",) for v in got.values()), f"{got}")
    finally:
        c.execute("ALTER ROLE postgres RESET idempotency.default_lease")


def concurrency(cl):
    n = 20
    for mode in ("autocommit", "transaction"):
        s = cl.scope(f"race-{mode}")
        conns = [connect(cl.coord_info) for _ in range(n)]
        barrier = threading.Barrier(n)
        outcomes = [None] * n

        def worker(i, mode=mode, s=s, conns=conns, barrier=barrier, outcomes=outcomes):  # this round's, bound
            conn = conns[i]
            try:
                barrier.wait()
                if mode == "autocommit":
                    outcomes[i] = conn.execute("SELECT outcome FROM idempotency.idem_claim(%s, 'one')",
                                               (s,)).fetchone()[0]
                else:
                    with conn.transaction():
                        o, tok = conn.execute("SELECT outcome, token FROM idempotency.idem_claim(%s, 'one')",
                                              (s,)).fetchone()
                        if o == "claimed":
                            time.sleep(0.3)  # the others wait on the unique index meanwhile
                            conn.execute("SELECT idempotency.idem_complete(%s, 'one', %s, 201)", (s, tok))
                    outcomes[i] = o
            except Exception as e:  # noqa: BLE001 - reported as the outcome
                outcomes[i] = f"error: {e}"

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for conn in conns:
            conn.close()
        counts = {o: outcomes.count(o) for o in set(outcomes)}
        rest = "in_progress" if mode == "autocommit" else "replay"
        check(f"20 connections claim one key at once ({mode}): exactly one claimed, {n - 1} {rest}",
              counts == {"claimed": 1, rest: n - 1}, f"{counts}")


def mixed(cl):
    """Claims and sightings of one key at once, half in transaction blocks (run on the
    coordinator, which takes the key lock there) and half in autocommit (delegated to the
    shard's worker, which takes it there): the two meet at the primary key, and every call
    still answers as the contract says (before the fix: 23505 from the late INSERT)."""
    n = 20
    s = cl.scope("mixed")
    conns = [connect(cl.coord_info) for _ in range(n)]
    barrier = threading.Barrier(n)
    outcomes = [None] * n
    sightings = [None] * n

    def worker(i):
        conn = conns[i]
        try:
            barrier.wait()
            if i % 2:
                outcomes[i] = conn.execute("SELECT outcome FROM idempotency.idem_claim(%s, 'one')", (s,)).fetchone()[0]
                sightings[i] = conn.execute("SELECT idempotency.idem_seen(%s, 'm')", (s,)).fetchone()[0]
            else:
                with conn.transaction():
                    outcomes[i] = conn.execute("SELECT outcome FROM idempotency.idem_claim(%s, 'one')",
                                               (s,)).fetchone()[0]
                    sightings[i] = conn.execute("SELECT (idempotency.idem_seen_many(%s, ARRAY['m']))[1]",
                                                (s,)).fetchone()[0]
                    time.sleep(0.2)  # the delegated calls meet this uncommitted row meanwhile
        except Exception as e:  # noqa: BLE001 - reported as the outcome
            outcomes[i] = f"error: {e}"

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for conn in conns:
        conn.close()
    counts = {o: outcomes.count(o) for o in set(outcomes)}
    check(f"{n} claims of one key, half in transaction blocks, half delegated: one claimed, the rest in_progress",
          counts == {"claimed": 1, "in_progress": n - 1}, f"{counts}")
    check(f"... and {n} sightings of one message: one first sighting, the rest duplicates",
          sightings.count(True) == 1 and sightings.count(False) == n - 1, f"{sightings}")


def partitions(cl):
    """Time partitions on Citus: the periods idem_sweep makes are distributed and colocated
    with keys, records past the periods move into a new one (no local copy left on the
    coordinator), and a period over is dropped with its shards. The other sections run with
    idempotency.partition_period = 0 (main): this one sets its own periods."""
    c = cl.c
    c.execute("SET idempotency.partition_period = '1 day'")
    made = c.execute("SELECT count(*) FROM idempotency.partitions_maintain() WHERE action = 'created'").fetchone()[0]
    periods = [r[0] for r in c.execute(
        "SELECT partition_name FROM idempotency.partitions WHERE kind = 'period' ORDER BY 1").fetchall()]
    check("idem_sweep's partitions_maintain() makes periods of keys and messages", made > 0 and len(periods) == made,
          f"made {made}, periods {periods}")
    colocated = c.execute(
        "SELECT count(DISTINCT colocationid), count(*) FROM pg_dist_partition "
        "WHERE logicalrelid::text = ANY(%s) OR logicalrelid = 'idempotency.keys'::regclass",
        (periods,)).fetchone()
    check("every period is distributed by scope, colocated with keys", colocated == (1, len(periods) + 1),
          f"{colocated}")
    scopes = [s for v in cl.scopes_on_each_worker("part", 2).values() for s in v]
    for s in scopes:
        c.execute("SELECT idempotency.idem_complete(%s, 'far', token, 201) "
                  "FROM idempotency.idem_claim(%s, 'far', ttl => '9 days')", (s, s))
    far = c.execute("SELECT count(*) FROM idempotency.keys_far WHERE scope = ANY(%s)", (scopes,)).fetchone()[0]
    check("records past the periods go to the far partition", far == len(scopes), f"{far} of {len(scopes)}")
    c.execute("SET idempotency.default_ttl = '10 days'")
    moved = c.execute("SELECT coalesce(sum(rows_moved), 0) FROM idempotency.partitions_maintain() "
                      "WHERE action = 'created'").fetchone()[0]
    c.execute("RESET idempotency.default_ttl")
    left = c.execute("SELECT count(*) FROM idempotency.keys_far WHERE scope = ANY(%s)", (scopes,)).fetchone()[0]
    check("a new period takes the far partition's records of its days", moved == len(scopes) and left == 0,
          f"moved {moved}, left {left}")
    local = c.execute("SELECT coalesce(sum(pg_relation_size(p.partition_name::regclass)), 0) "
                      "FROM idempotency.partitions AS p WHERE p.kind = 'period'").fetchone()[0]
    check("no local copy of the moved rows is left on the coordinator", local == 0, f"{local} bytes")
    replays = [c.execute("SELECT outcome FROM idempotency.idem_claim(%s, 'far')", (s,)).fetchone()[0] for s in scopes]
    check("the moved records replay (read on their workers)", replays == ["replay"] * len(scopes), f"{replays}")
    # Periods of a second that end soon: the existing ones go first (so that new ones start now).
    for (p,) in c.execute("SELECT partition_name FROM idempotency.partitions WHERE kind = 'period'").fetchall():
        c.execute(f"DROP TABLE {p}")
    c.execute("SET idempotency.partition_period = '1 s'")
    c.execute("SET idempotency.default_ttl = '1 s'")
    made_short = c.execute(
        "SELECT string_agg(partition_name, ' ') FROM idempotency.partitions_maintain()").fetchone()[0]
    # (A delegated call does not see the coordinator session's default_ttl: the ttl is given.)
    for s in scopes:
        c.execute("SELECT idempotency.idem_complete(%s, 'short', token, 201) "
                  "FROM idempotency.idem_claim(%s, 'short', ttl => '1 s')", (s, s))
        c.execute("SELECT idempotency.idem_seen(%s, 'short', '1 s')", (s,))
    in_periods = c.execute("SELECT (SELECT count(*) FROM idempotency.keys WHERE scope = ANY(%s) AND key = 'short') "
                           "- (SELECT count(*) FROM idempotency.keys_far WHERE scope = ANY(%s) AND key = 'short')",
                           (scopes, scopes)).fetchone()[0]
    far_short = c.execute("SELECT string_agg(expires_at::text, ' ') FROM idempotency.keys_far "
                          "WHERE scope = ANY(%s) AND key = 'short'", (scopes,)).fetchone()[0]
    time.sleep(3.5)
    dropped = [r[0] for r in c.execute(
        "SELECT partition_name FROM idempotency.partitions_maintain() WHERE action = 'dropped'").fetchall()]
    still = c.execute("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text = ANY(%s)",
                      (dropped,)).fetchone()[0]
    left = c.execute("SELECT (SELECT count(*) FROM idempotency.keys WHERE scope = ANY(%s) AND key = 'short') + "
                     "(SELECT count(*) FROM idempotency.messages WHERE scope = ANY(%s) AND message_id = 'short')",
                     (scopes, scopes)).fetchone()[0]
    check("periods that ended are dropped, with their shards, and their records are gone",
          in_periods == len(scopes) and dropped and still == 0 and left == 0,
          f"{in_periods} of {len(scopes)} in periods (made {made_short}, far: {far_short}), dropped {dropped}, "
          f"{still} still distributed, {left} left")
    c.execute("RESET idempotency.partition_period")
    c.execute("RESET idempotency.default_ttl")


def maintenance(cl):
    c = cl.c
    # Expired rows (keys and messages) and live rows on both workers.
    on = cl.scopes_on_each_worker("sweep", 3)
    scopes = [s for v in on.values() for s in v]
    for s in scopes:
        for i in range(5):
            c.execute("SELECT idempotency.idem_claim(%s, %s, ttl => '1 ms')", (s, f"old-{i}"))
            c.execute("SELECT idempotency.idem_seen(%s, %s, ttl => '1 ms')", (s, f"old-{i}"))
        c.execute("SELECT idempotency.idem_claim(%s, 'live')", (s,))
        c.execute("SELECT idempotency.idem_seen(%s, 'live')", (s,))
    time.sleep(0.05)

    def expired_per_worker():
        out = {}
        for port, ss in on.items():
            out[port] = c.execute(
                "SELECT (SELECT count(*) FROM idempotency.keys WHERE scope = ANY(%s) AND expires_at <= now()) + "
                "(SELECT count(*) FROM idempotency.messages WHERE scope = ANY(%s) AND expires_at <= now())",
                (ss, ss)).fetchone()[0]
        return out

    before = expired_per_worker()
    check("expired rows on both workers before the sweep", all(v == 30 for v in before.values()), f"{before}")
    total = sum(before.values())
    swept = True
    try:
        r = c.execute("SELECT idempotency.idem_sweep(10)").fetchone()[0]
        check("idem_sweep(10) deletes 10 rows across shards", r == 10, f"returned {r}")
        r = c.execute("SELECT idempotency.idem_sweep()").fetchone()[0]
        check("idem_sweep() deletes the rest", r == total - 10, f"returned {r}, expected {total - 10}")
    except psycopg.errors.DatabaseError as e:
        swept = False
        check("idem_sweep across shards", False, f"{e.sqlstate}: {e}".strip(), NEEDS_REPLACEMENT)
    after = expired_per_worker()
    check("no expired row left on either worker", all(v == 0 for v in after.values()), f"{after}",
          "" if swept else NEEDS_REPLACEMENT)
    live = c.execute("SELECT count(*) FROM idempotency.keys WHERE scope = ANY(%s) AND key = 'live'",
                     (scopes,)).fetchone()[0]
    check("the sweep left every live record", live == len(scopes), f"{live} of {len(scopes)}")

    for s in scopes:
        c.execute("SELECT idempotency.idem_claim(%s, 'old-all', ttl => '1 ms')", (s,))
    time.sleep(0.05)
    try:
        c.execute("CALL idempotency.idem_sweep_all(2)")
        left = c.execute("SELECT count(*) FROM idempotency.keys WHERE expires_at <= now() AND scope = ANY(%s)",
                         (scopes,)).fetchone()[0]
        check("CALL idem_sweep_all(2) empties the backlog on both workers", left == 0, f"{left} left")
    except psycopg.errors.DatabaseError as e:
        check("CALL idem_sweep_all across shards", False, f"{e.sqlstate}: {e}".strip(), NEEDS_REPLACEMENT)

    # Stale claims on both workers.
    on = cl.scopes_on_each_worker("stale", 2)
    scopes = [s for v in on.values() for s in v]
    old = {}
    for s in scopes:
        old[s] = c.execute("SELECT token FROM idempotency.idem_claim(%s, 'st', lease => '1 ms')", (s,)).fetchone()[0]
    time.sleep(0.05)
    try:
        rows = c.execute("SELECT scope, token, attempts "
                         "FROM idempotency.idem_reclaim_stale(100, release => false, lease => '1 ms') "
                         "WHERE scope = ANY(%s)", (scopes,)).fetchall()
        check("idem_reclaim_stale(release => false) takes over the stale claims on both workers",
              sorted(r[0] for r in rows) == sorted(scopes) and all(r[1] != old[r[0]] and r[2] == 2 for r in rows),
              f"{rows}")
        owners = c.execute("SELECT scope, token FROM idempotency.keys WHERE scope = ANY(%s)", (scopes,)).fetchall()
        check("the new tokens own the records", sorted(owners) == sorted((r[0], r[1]) for r in rows), f"{owners}")
        time.sleep(0.05)
        rows = c.execute("SELECT scope FROM idempotency.idem_reclaim_stale(100) WHERE scope = ANY(%s)",
                         (scopes,)).fetchall()
        left = c.execute("SELECT count(*) FROM idempotency.keys WHERE scope = ANY(%s)", (scopes,)).fetchone()[0]
        check("idem_reclaim_stale() releases the stale claims on both workers",
              sorted(r[0] for r in rows) == sorted(scopes) and left == 0, f"{rows}, {left} left")
    except psycopg.errors.DatabaseError as e:
        check("idem_reclaim_stale across shards", False, f"{e.sqlstate}: {e}".strip(), NEEDS_REPLACEMENT)

    # Against a claim replacing / taking over the same record in an open transaction.
    race_with_claim(cl, "sweep", "SELECT idempotency.idem_sweep()")
    race_with_claim(cl, "reclaim", "SELECT count(*) FROM idempotency.idem_reclaim_stale()")


def race_with_claim(cl, what, maintenance_sql):
    """A claim replaces (sweep) or takes over (reclaim) a record inside an open transaction;
    the maintenance call runs meanwhile. It may wait for the claim (Citus) or skip the row,
    but the record must survive with the claim's token."""
    c = cl.c
    s = cl.scope(f"race-{what}")
    if what == "sweep":
        c.execute("SELECT idempotency.idem_claim(%s, 'r', ttl => '1 ms')", (s,))
    else:
        c.execute("SELECT idempotency.idem_claim(%s, 'r', lease => '1 ms')", (s,))
    time.sleep(0.05)
    a = connect(cl.coord_info)
    b = connect(cl.coord_info)
    result = {}
    try:
        a.execute("BEGIN")
        o, tok = a.execute("SELECT outcome, token FROM idempotency.idem_claim(%s, 'r')", (s,)).fetchone()
        expected = "claimed" if what == "sweep" else "reclaimed"

        def run():
            try:
                b.execute("SET lock_timeout = '20s'")
                result["value"] = b.execute(maintenance_sql).fetchone()
            except Exception as e:  # noqa: BLE001
                result["error"] = e

        t = threading.Thread(target=run)
        t.start()
        t.join(1.0)
        waited = t.is_alive()
        a.execute("COMMIT")
        t.join(30)
        row = c.execute("SELECT token, status FROM idempotency.keys WHERE scope = %s AND key = 'r'", (s,)).fetchone()
        name = (f"{'idem_sweep' if what == 'sweep' else 'idem_reclaim_stale'}"
                f" during a claim {'replacing an expired' if what == 'sweep' else 'taking over a stale'} record "
                f"({'waited for it' if waited else 'did not wait'}): the claim keeps it")
        if "error" in result:
            e = result["error"]
            check(name, False, f"{getattr(e, 'sqlstate', '')}: {e}".strip(), NEEDS_REPLACEMENT)
        else:
            check(name, o == expected and row == (tok, "in_progress"), f"claim said {o}, record now {row}")
    finally:
        a.close()
        b.close()


def repeated(cl):
    """idem_sweep(1) and idem_reclaim_stale(1) called over and over in one fresh session, on
    rows held by both workers. The extension keeps its statements prepared per backend, and
    after five runs PostgreSQL may switch a statement to its generic plan: each call must
    still find the rows of every shard, take exactly its budget, and keep the fence."""
    c = cl.c
    on = cl.scopes_on_each_worker("rep", 4)
    scopes = [s for v in on.values() for s in v]
    old = {}
    for s in scopes:
        c.execute("SELECT idempotency.idem_claim(%s, 'old', ttl => '1 ms')", (s,))
        c.execute("SELECT idempotency.idem_seen(%s, 'old', ttl => '1 ms')", (s,))
        old[s] = c.execute("SELECT token FROM idempotency.idem_claim(%s, 'stale', lease => '1 ms')", (s,)).fetchone()[0]
        c.execute("SELECT idempotency.idem_claim(%s, 'live')", (s,))
    time.sleep(0.05)
    expired_sql = ("SELECT (SELECT count(*) FROM idempotency.keys WHERE expires_at <= now()) + "
                   "(SELECT count(*) FROM idempotency.messages WHERE expires_at <= now())")
    backlog = c.execute(expired_sql).fetchone()[0]   # other sections' leftovers count too

    with connect(cl.coord_info) as fresh:
        try:
            swept = []
            while len(swept) <= backlog + 1:
                swept.append(fresh.execute("SELECT idempotency.idem_sweep(1)").fetchone()[0])
                if swept[-1] == 0:
                    break
            check(f"idem_sweep(1) called {len(swept)} times in one session: one row each, "
                  f"until the {backlog} expired rows of both workers are gone",
                  backlog >= 2 * len(scopes) and swept == [1] * backlog + [0], f"{swept}")
            left = c.execute(expired_sql).fetchone()[0]
            live = c.execute("SELECT count(*) FROM idempotency.keys WHERE scope = ANY(%s) AND key IN ('live', 'stale')",
                             (scopes,)).fetchone()[0]
            check("... no expired row left on either worker, every live record kept",
                  left == 0 and live == 2 * len(scopes), f"{left} expired left, {live} live of {2 * len(scopes)}")
        except psycopg.errors.DatabaseError as e:
            check("idem_sweep(1) over and over across shards", False, f"{e.sqlstate}: {e}".strip(), NEEDS_REPLACEMENT)

        try:
            taken = []
            for _ in range(100):
                rows = fresh.execute(
                    "SELECT scope, key, token FROM idempotency.idem_reclaim_stale(1, release => false)").fetchall()
                taken.append(rows)
                if not rows:
                    break
            mine = sorted(r[0] for rows in taken for r in rows if r[0] in old and r[1] == "stale")
            check(f"idem_reclaim_stale(1, release => false) called {len(taken)} times in one session: at most one "
                  "claim each, the stale claims of both workers taken over",
                  all(len(rows) <= 1 for rows in taken) and not taken[-1] and mine == sorted(scopes)
                  and len(taken) > 6, f"{[len(rows) for rows in taken]}, mine {mine}")
            new = {r[0]: r[2] for rows in taken for r in rows if r[0] in old and r[1] == "stale"}
            s = scopes[0]
            fenced = c.execute("SELECT idempotency.idem_release(%s, 'stale', %s)", (s, old[s])).fetchone()[0]
            owner = c.execute("SELECT idempotency.idem_release(%s, 'stale', %s)", (s, new.get(s))).fetchone()[0]
            check("the token a takeover replaced is fenced (idem_release: false), the new one owns the claim (true)",
                  (fenced, owner) == (False, True), f"old token: {fenced}, new token: {owner}")
        except psycopg.errors.DatabaseError as e:
            check("idem_reclaim_stale(1) over and over across shards", False, f"{e.sqlstate}: {e}".strip(),
                  NEEDS_REPLACEMENT)


def misc(cl):
    c = cl.c
    r = c.execute("SELECT idempotency.idem_fingerprint('{\"b\":1,\"a\":2}'::jsonb) = "
                  "idempotency.idem_fingerprint('{ \"a\": 2, \"b\": 1.0 }'::jsonb)").fetchone()
    check("idem_fingerprint on the coordinator", r == (True,), f"{r}")
    try:
        stats = c.execute("SELECT in_progress, completed, stale, expired FROM idempotency.stats").fetchone()
        direct = c.execute(
            "SELECT count(*) FILTER (WHERE status = 'in_progress' AND expires_at > now()), "
            "count(*) FILTER (WHERE status = 'completed' AND expires_at > now()), "
            "count(*) FILTER (WHERE status = 'in_progress' AND locked_until <= now() AND expires_at > now()), "
            "count(*) FILTER (WHERE expires_at <= now()) FROM idempotency.keys").fetchone()
        check("idempotency.stats counts the rows of every shard", stats == direct, f"stats {stats}, direct {direct}")
    except psycopg.errors.DatabaseError as e:
        check("idempotency.stats", False, f"{e.sqlstate}: {e}")


def read_path(cl):
    """Where Citus is loaded, idem_claim and idem_seen read through SPI (docs/operations.md#read-paths):
    a distributed table is a shell on the node the function runs on, and Citus routes the
    statement to the shard. Asked on the coordinator and on a worker, with the direct read on."""
    scope = cl.scope("read-path")
    for where, info in [("the coordinator", cl.coord_info), ("a worker", next(iter(cl.workers.values())))]:
        notes = []
        with connect(info) as conn:
            conn.add_notice_handler(lambda d, notes=notes: notes.append(d.message_primary or ""))
            conn.execute("SET idempotency.direct_read = on")
            conn.execute("SET client_min_messages = debug1")
            # With a WHERE clause Citus runs the call here instead of delegating it to the
            # shard's node, whose DEBUG lines would not come back. (Joined with a VALUES list
            # instead, Citus 13.0.5's planner crashes the backend while it deparses the query to
            # delegate it, before the function runs.)
            claim = "SELECT outcome FROM idempotency.idem_claim(%s, 'k', 'fp') WHERE outcome IS NOT NULL"
            first = conn.execute(claim, (scope + where,)).fetchone()
            again = conn.execute(claim, (scope + where,)).fetchone()
            seen = conn.execute("SELECT idempotency.idem_seen(%s, 'm'), idempotency.idem_seen(%s, 'm')",
                                (scope + where, scope + where)).fetchone()
        direct = [n for n in notes if n.startswith("idempotency.") and "read directly" in n]
        spi = [n for n in notes if n.startswith("idempotency.") and "read through SPI: Citus is loaded" in n]
        check(f"on {where}: no look-up is read directly", not direct, f"{direct}")
        check(f"on {where}: idem_claim and idem_seen say they read through SPI because Citus is loaded",
              any(n.startswith("idempotency.keys") for n in spi)
              and any(n.startswith("idempotency.messages") for n in spi),
              f"{notes}")
        check(f"on {where}, the answers through SPI: claimed, then in_progress; the message new, then a duplicate",
              (first, again, seen) == (("claimed",), ("in_progress",), (True, False)), f"{first} {again} {seen}")


def sending(cl):
    """The sending side on Citus: idempotency.outbound stays a table of the coordinator (no
    shards to search), written in the same transaction as distributed business tables."""
    c = cl.c
    dist = c.execute("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid IN "
                     "('idempotency.outbound'::regclass, 'idempotency.outbound_budget'::regclass)").fetchone()[0]
    check("distribute() leaves outbound and outbound_budget on the coordinator", dist == 0, f"{dist} distributed")
    orders = f"send_orders_{cl.tag}"
    c.execute(f"CREATE TABLE {orders} (id text PRIMARY KEY, payment_key text NOT NULL)")
    c.execute(f"SELECT create_distributed_table('{orders}', 'id')")
    scope, target = cl.scope("send"), cl.scope("gateway")

    def business(order, commit):
        with psycopg.connect(cl.coord_info) as t:
            key = t.execute("SELECT key FROM idempotency.idem_send(%s, %s, %s, %s::jsonb)",
                            (scope, f"{order}:charge", target, '{"amount": 1}')).fetchone()[0]
            t.execute(f"INSERT INTO {orders} VALUES (%s, %s)", (order, key))
            t.commit() if commit else t.rollback()
            return key

    keys = {business(f"o{i}", True) for i in range(4)}
    business("gone", False)
    kept = {r[0] for r in c.execute(f"SELECT payment_key FROM {orders}").fetchall()}
    rows = c.execute("SELECT count(*) FROM idempotency.outbound WHERE scope = %s", (scope,)).fetchone()[0]
    check("idem_send and a distributed table's write commit together, and roll back together",
          kept == keys and rows == 4, f"{len(kept)} orders, {rows} sends")
    # Two senders on the coordinator at once: each send is handed out once (SKIP LOCKED).
    with psycopg.connect(cl.coord_info) as a, psycopg.connect(cl.coord_info) as b:
        first = a.execute("SELECT key FROM idempotency.idem_send_next(%s, 3, '1 minute')", (target,)).fetchall()
        second = b.execute("SELECT key FROM idempotency.idem_send_next(%s, 3, '1 minute')", (target,)).fetchall()
        a.commit()
        b.commit()
    taken = [r[0] for r in first + second]
    check("two senders in open transactions take different sends, every one once",
          sorted(taken) == sorted(keys) and len(first) == 3, f"{len(first)} + {len(second)}: {taken}")
    token = c.execute("SELECT token FROM idempotency.outbound WHERE scope = %s AND operation = 'o0:charge'",
                      (scope,)).fetchone()[0]
    r = c.execute("SELECT state FROM idempotency.idem_send_result(%s, 'o0:charge', %s, 201, '{}', '{}')",
                  (scope, token)).fetchone()
    check("idem_send_result records the answer", r == ("done",), f"{r}")
    inline = c.execute("SELECT count(*) FROM idempotency.idem_send_next(scope => %s, operation => 'o0:charge')",
                       (scope,)).fetchone()[0]
    check("the inline form finds nothing to send for a done operation", inline == 0, f"{inline}")
    st = sqlstate_of(c, "SELECT * FROM idempotency.idem_send(%s, 'o1:charge', %s, '{\"amount\": 2}')", (scope, target))
    check("idem_send of a recorded operation with another request: IK004", st == "IK004", f"got {st}")
    stats = c.execute("SELECT outbound_sending FROM idempotency.stats").fetchone()
    check("idempotency.stats counts outbound rows", stats is not None and stats[0] >= 3, f"{stats}")
    delegated = c.execute("SELECT count(*) FROM pg_dist_object d JOIN pg_proc p ON d.classid = 'pg_proc'::regclass "
                          "AND d.objid = p.oid WHERE p.proname LIKE 'idem\\_send%'").fetchone()[0]
    check("the sending side's functions are not delegated to workers", delegated == 0, f"{delegated}")
    started = c.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    nulls = [sqlstate_of(c, "SELECT * FROM idempotency.idem_send(NULL, 'o', 't')"),
             sqlstate_of(c, "SELECT * FROM idempotency.idem_send(%s, 'o', 't')", (None,)),
             sqlstate_of(c, "SELECT * FROM idempotency.idem_send_result(NULL, 'o', gen_random_uuid(), 201)")]
    now = c.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    check("a NULL scope to idem_send / idem_send_result: 22004, the coordinator not restarted",
          nulls == ["22004"] * 3 and now == started, f"{nulls}, started {started}, now {now}")
    c.execute(f"DROP TABLE {orders}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", action="append", required=True)
    args = ap.parse_args()
    cl = Cluster(args.coordinator, args.worker)
    sections = [("distribution", distribution), ("contract autocommit", lambda x: contract(x, "autocommit")),
                ("contract transaction", lambda x: contract(x, "transaction")), ("settings", settings),
                ("concurrency", concurrency), ("mixed", mixed), ("repeated calls", repeated),
                ("maintenance", maintenance), ("misc", misc), ("null scope", null_scope), ("sending", sending),
                ("read path", read_path), ("partitions", partitions)]
    # The sections before "partitions" check the sweep's DELETE of expired records: no
    # periods (a period's expired records wait for its drop, which "partitions" checks).
    db = cl.c.execute("SELECT current_database()").fetchone()[0]
    cl.c.execute(psycopg.sql.SQL("ALTER DATABASE {} SET idempotency.partition_period = 0")
                 .format(psycopg.sql.Identifier(db)))
    cl.c.close()
    cl.c = connect(cl.coord_info)
    for name, fn in sections:
        print(f"-- {name}", flush=True)
        try:
            fn(cl)
        except Exception as e:  # noqa: BLE001 - a section that breaks counts as one failure
            check(f"section {name} ran to the end", False, f"{type(e).__name__}: {e}".replace("\n", " "))
            try:
                cl.c.close()
            except Exception:  # noqa: BLE001
                pass
            time.sleep(1)
            cl.c = connect(cl.coord_info)
    print(f"summary passed={passed} failed={failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
