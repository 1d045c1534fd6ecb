#!/usr/bin/python3
"""bench/simulate.sh's parts that talk to a running server, and its report (issue 35).

  simulate.py run  CONN... --design NAME --day S --periods N --days D --rate R --clients C
                   --sweep-every S --script FILE --out DIR
      Compressed days of traffic against one database: pgbench -R R claims + completes (FILE)
      for D + 1 days of S seconds each (the first one fills the table), CALL
      idempotency.idem_sweep_all() every --sweep-every seconds (the compressed pg_cron
      schedule), and at each period's end (S / N seconds, aligned on the epoch as the
      partitions are) a sample of the WAL position and of every table of idempotency.keys
      (pg_stat_user_tables, sizes); at each day's end the live records' own size (copied into
      a temporary table with their primary key). Writes DIR/claims.* (pgbench's log),
      samples.tsv, tables.tsv, sweeps.tsv, days.tsv, run.json.
  simulate.py drop CONN... --mode partitions|delete --rows N --rate R --clients C --script FILE
                   --out DIR [--base S]
      Expiring N records at once, claims going on at R per second: partitions: N records in
      the current period, then, once it ended, the sweep that drops it; delete: N expired
      records, then the sweep that deletes them (CALL idem_sweep_all(), its defaults). Writes
      DIR/drop.json (statement time, WAL, dead tuples before and after, claims' p99 in the BASE
      seconds before it and during it) and DIR/claims.*.
  simulate.py report OUT
      OUT/<design>/ of each run and OUT/drop-<mode>/ of each drop: OUT/periods.tsv (one row
      per design and period), OUT/days.tsv, OUT/summary.md (with issue 35's goals).
CONN: --host SOCKET_DIR --port P --db NAME --pgbench PATH (pgbench of that server's PostgreSQL).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import threading
import time

GOAL_DROP_SECONDS = 1.0
GOAL_P99_DURING_OVER_WITHOUT = 1.1
GOAL_SIZE_OVER_LIVE = 1.2

# Every table of idempotency.keys: 0.5.0's one table, 0.6.0's partitions.
KEYS_TABLES = """
SELECT c.oid, c.relname, s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.vacuum_count,
       s.n_tup_ins, s.n_tup_upd, s.n_tup_del,
       coalesce(pg_total_relation_size(c.oid), 0), coalesce(pg_relation_size(c.oid), 0),
       coalesce(pg_indexes_size(c.oid), 0)
  FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid
 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'r'
   AND (c.relname = 'keys' OR c.relname LIKE 'keys\\_%')"""
TABLE_COLUMNS = ["relid", "relname", "live", "dead", "autovacuums", "vacuums", "ins", "upd", "del",
                 "total_bytes", "table_bytes", "index_bytes"]
PARTS = ("SELECT coalesce(array_agg(inhrelid::regclass::text), '{}') FROM pg_inherits "
         "WHERE inhparent = 'idempotency.keys'::regclass")
WAL = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
# The records a 0.6.0 or a 0.5.0 table holds, made quickly: completed, keys like uuids.
FILL = """
INSERT INTO idempotency.keys (scope, key, fingerprint, status, token, attempts, response_status,
                              response_headers, response_body, created_at, updated_at, completed_at, expires_at)
SELECT 'acct_' || (i %% 100) || ' POST /orders', md5(i::text)::uuid::text, 'sha256:' || md5(i::text), 'completed',
       gen_random_uuid(), 1, 201, '{"Location": "/orders/ord_1"}'::jsonb,
       jsonb_build_object('id', 'ord_' || i, 'amount', i %% 1000, 'currency', 'usd'), now(), now(), now(),
       %(lo)s::timestamptz + (i %% 1000) * (%(hi)s::timestamptz - %(lo)s::timestamptz) / 1000
  FROM generate_series(%(a)s::bigint, %(b)s::bigint) AS i"""


# --- pure parts -------------------------------------------------------------------------------

def read_claims(prefix_dir, prefix="claims"):
    """The transactions of pgbench's logs (-l, with -R): (start, end, latency ms, own ms), start
    being when the transaction was due (its latency counts from then), own its latency less
    the schedule lag."""
    out = []
    for name in sorted(os.listdir(prefix_dir)):
        if not name.startswith(prefix + ".") or name.endswith(".out"):
            continue
        with open(os.path.join(prefix_dir, name)) as f:
            for line in f:
                p = line.split()
                if len(p) < 6 or not p[2].isdigit():
                    continue
                end = int(p[4]) + int(p[5]) / 1e6
                lat = int(p[2]) / 1000
                lag = int(p[6]) / 1000 if len(p) >= 7 and p[6].isdigit() else 0.0
                out.append((end - lat / 1000, end, lat, lat - lag))
    return out


def pct(values, p):
    """Nearest-rank percentile of an unsorted list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))]


def overlaps(start, end, windows):
    """Does [start, end] overlap any of the sorted, disjoint (from, to) windows?"""
    lo, hi = 0, len(windows)
    while lo < hi:  # the first window that ends at or after start
        mid = (lo + hi) // 2
        if windows[mid][1] < start:
            lo = mid + 1
        else:
            hi = mid
    return lo < len(windows) and windows[lo][0] <= end


def split_by_windows(claims, windows):
    """The claims' latencies (ms) split into those that overlap a window and the others."""
    windows = sorted(windows)
    during, without = [], []
    for start, end, lat, _own in claims:
        (during if overlaps(start, end, windows) else without).append(lat)
    return during, without


def table_deltas(prev, cur, column):
    """The growth of a cumulative per-table count between two samples ({relid: row}); a table
    new since the first counts from 0, a table gone (dropped) is left out."""
    return sum(int(r[column]) - int(prev[rid][column]) if rid in prev else int(r[column]) for rid, r in cur.items())


def period_rows(design, run, samples, tables, sweeps, claims):
    """One row per period of a run: claims' rate and percentiles, WAL, the tables' dead tuples
    and size at its end, autovacuum runs, and the sweeps that started in it."""
    rows = []
    t0, period, per_day = run["t0"], run["period"], run["periods"]
    by_k = {int(s["k"]): s for s in samples}
    tabs = {}
    for t in tables:
        tabs.setdefault(int(t["k"]), {})[t["relid"]] = t
    per_period = {}
    for c in claims:  # by the period they ended in
        per_period.setdefault(math.floor((c[1] - t0) / period) + 1, []).append(c)
    for k in sorted(by_k):
        if k == 0 or k - 1 not in by_k:
            continue
        lo, hi = t0 + (k - 1) * period, t0 + k * period
        lat = [c[2] for c in per_period.get(k, [])]
        own = [c[3] for c in per_period.get(k, [])]
        in_period = [s for s in sweeps if lo <= float(s["start"]) < hi]
        cur, prev = tabs.get(k, {}), tabs.get(k - 1, {})
        rows.append({
            "design": design, "period": k, "day": round(k / per_day, 4),
            "claims": len(lat), "tps": round(len(lat) / period, 1),
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "p99_own_ms": pct(own, 99),
            "max_ms": max(lat, default=None),
            "wal_bytes": int(by_k[k]["wal"]) - int(by_k[k - 1]["wal"]),
            "dead_tuples": sum(int(r["dead"]) for r in cur.values()),
            "live_tuples": sum(int(r["live"]) for r in cur.values()),
            "total_bytes": sum(int(r["total_bytes"]) for r in cur.values()),
            "index_bytes": sum(int(r["index_bytes"]) for r in cur.values()),
            "partitions": len(cur),
            "autovacuums": table_deltas(prev, cur, "autovacuums"),
            "expiry_ms": round(sum(float(s["ms"]) for s in in_period), 3),
            "expiry_max_ms": max((float(s["ms"]) for s in in_period), default=0.0),
            "sweeps": len(in_period),
            "deleted": sum(int(s["deleted"]) for s in in_period),
            "dropped": sum(int(s["dropped"]) for s in in_period),
            "made": sum(int(s["made"]) for s in in_period),
        })
    return rows


def expiring(sweep, design_kind):
    """Did this sweep call expire records: drop a period (partitions) or delete rows (delete)?"""
    return int(sweep["dropped"]) > 0 if design_kind == "partitions" else int(sweep["deleted"]) > 0


# --- talking to the server ----------------------------------------------------------------------

def connect(a):
    import psycopg  # only the parts that talk to a server need it

    return psycopg.connect(host=a.host, port=a.port, dbname=a.db, user="postgres", autocommit=True)


def write_tsv(path, header, rows, mode="w"):
    """Rows (dicts, or sequences in the header's order) as tab-separated lines; "w" writes the header first."""
    with open(path, mode) as f:
        if mode == "w":
            f.write("\t".join(header) + "\n")
        for r in rows:
            values = [r[h] for h in header] if isinstance(r, dict) else list(r)
            f.write("\t".join("" if v is None else str(v) for v in values) + "\n")


def sample(conn, k, out):
    now = time.time()
    wal = conn.execute(WAL).fetchone()[0]
    rows = conn.execute(KEYS_TABLES).fetchall()
    write_tsv(os.path.join(out, "samples.tsv"), ["k", "t", "wal"], [(k, f"{now:.3f}", wal)], mode="a")
    write_tsv(os.path.join(out, "tables.tsv"), ["k"] + TABLE_COLUMNS, [(k, *r) for r in rows], mode="a")


def live_size(conn, day, out):
    """The live records' own size: a copy of them with their primary key (a temporary table)."""
    t = time.time()
    conn.execute("CREATE TEMP TABLE sim_live AS SELECT * FROM idempotency.keys WHERE expires_at > now()")
    conn.execute("ALTER TABLE sim_live ADD PRIMARY KEY (scope, key)")
    n, size = conn.execute("SELECT count(*), pg_total_relation_size('sim_live') FROM sim_live").fetchone()
    conn.execute("DROP TABLE sim_live")
    total = sum(r[9] for r in conn.execute(KEYS_TABLES).fetchall())
    write_tsv(os.path.join(out, "days.tsv"), ["day", "t", "live_rows", "live_bytes", "total_bytes"],
              [(day, f"{t:.3f}", n, size, total)], mode="a")


def sweep_once(conn, notices):
    before = set(conn.execute(PARTS).fetchone()[0])
    notices.clear()
    t1 = time.time()
    conn.execute("CALL idempotency.idem_sweep_all()")
    t2 = time.time()
    after = set(conn.execute(PARTS).fetchone()[0])
    deleted = sum(int(m.group(1)) for n in notices for m in [re.search(r"deleted (\d+)", n)] if m)
    return {"start": f"{t1:.6f}", "end": f"{t2:.6f}", "ms": f"{(t2 - t1) * 1000:.3f}", "deleted": deleted,
            "partitions_before": len(before), "partitions_after": len(after),
            "dropped": len(before - after), "made": len(after - before)}


SWEEP_COLUMNS = ["start", "end", "ms", "deleted", "partitions_before", "partitions_after", "dropped", "made"]


def sweeper(a, stop, out):
    conn = connect(a)
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    write_tsv(os.path.join(out, "sweeps.tsv"), SWEEP_COLUMNS, [])
    next_at = time.time()
    while not stop.is_set():
        next_at += a.sweep_every
        try:
            s = sweep_once(conn, notices)
            write_tsv(os.path.join(out, "sweeps.tsv"), SWEEP_COLUMNS, [s], mode="a")
        except Exception as e:  # a sweep that fails is reported, and the next one runs
            print(f"simulate: a sweep failed: {e}", file=sys.stderr)
        stop.wait(max(0.0, next_at - time.time()))


def pgbench(a, seconds, prefix, extra=()):
    cmd = [a.pgbench, "-h", a.host, "-p", str(a.port), "-U", "postgres", "-n", "-M", "prepared",
           "-c", str(a.clients), "-j", str(min(a.clients, 2)), "-R", str(a.rate), "-T", str(int(math.ceil(seconds))),
           "-l", f"--log-prefix={prefix}", *extra, "-f", a.script, a.db]
    return subprocess.Popen(cmd, stdout=open(prefix + ".out", "w"), stderr=subprocess.STDOUT)


class Load:
    """Claims at a fixed rate until stopped, as back-to-back pgbench runs of `chunk` seconds: each
    run ends on its own and so writes its whole log (a pgbench killed loses the log it buffered);
    between two runs the claims pause for as long as pgbench takes to connect."""

    def __init__(self, a, prefix, chunk):
        self.a, self.prefix, self.chunk = a, prefix, chunk
        self.stop, self.failed = threading.Event(), False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            if pgbench(self.a, self.chunk, f"{self.prefix}.c{n}").wait() != 0:
                self.failed = True
                return

    def finish(self):
        self.stop.set()
        self.thread.join()
        return not self.failed


def sleep_until(t):
    time.sleep(max(0.0, t - time.time()))


def run(a):
    os.makedirs(a.out, exist_ok=True)
    period = a.day / a.periods
    conn = connect(a)
    conn.execute("SELECT idempotency.idem_sweep()")  # the periods, where the design has them
    t0 = math.ceil(time.time() / period) * period
    if t0 - time.time() < 0.5:
        t0 += period
    n = a.periods * (a.days + 1)
    json.dump({"design": a.design, "kind": a.kind, "description": a.description, "order": a.order, "t0": t0,
               "period": period, "periods": a.periods, "day": a.day, "days": a.days + 1, "rate": a.rate,
               "clients": a.clients, "sweep_every": a.sweep_every},
              open(os.path.join(a.out, "run.json"), "w"))
    write_tsv(os.path.join(a.out, "samples.tsv"), ["k", "t", "wal"], [])
    write_tsv(os.path.join(a.out, "tables.tsv"), ["k"] + TABLE_COLUMNS, [])
    write_tsv(os.path.join(a.out, "days.tsv"), ["day", "t", "live_rows", "live_bytes", "total_bytes"], [])
    sleep_until(t0)
    sample(conn, 0, a.out)
    bench = pgbench(a, n * period, os.path.join(a.out, "claims"))
    stop = threading.Event()
    sweeps = threading.Thread(target=sweeper, args=(a, stop, a.out), daemon=True)
    sweeps.start()
    for k in range(1, n + 1):
        sleep_until(t0 + k * period)
        sample(conn, k, a.out)
        if k % a.periods == 0:
            live_size(conn, k // a.periods, a.out)
        print(f"  {a.design}: period {k}/{n} (day {k / a.periods:.2f})", flush=True)
    stop.set()
    sweeps.join()
    if bench.wait() != 0:
        print(f"simulate: pgbench failed, see {a.out}/claims.out", file=sys.stderr)
        return 1
    return 0


def dead_tuples(conn):
    conn.execute("SELECT pg_stat_force_next_flush()")
    return sum(r[3] for r in conn.execute(KEYS_TABLES).fetchall())


def drop(a):
    os.makedirs(a.out, exist_ok=True)
    conn = connect(a)
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("SELECT idempotency.idem_sweep()")
    if a.mode == "partitions":
        target = conn.execute(
            "SELECT partition_name, lower_bound, upper_bound FROM idempotency.partitions "
            "WHERE kind = 'period' AND partition_name LIKE 'idempotency.keys%' "
            "AND lower_bound <= now() AND upper_bound > now()").fetchone()
        if target is None:
            print("simulate: no period holds now(): is idempotency.partition_period 0?", file=sys.stderr)
            return 1
        name, lo, hi = target
    else:
        name = None
        lo, hi = conn.execute("SELECT now() - interval '2 hours', now() - interval '1 hour'").fetchone()
    t = time.time()
    for b in range(1, a.rows + 1, 1_000_000):
        conn.execute(FILL, {"lo": lo, "hi": hi, "a": b, "b": min(b + 999_999, a.rows)})
    fill_s = time.time() - t
    print(f"  drop ({a.mode}): {a.rows} records in {fill_s:.1f} s{' into ' + name if name else ''}", flush=True)
    conn.execute("VACUUM ANALYZE idempotency.keys" if a.mode == "delete" else f"VACUUM ANALYZE {name}")
    if name:
        size = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (name,)).fetchone()[0]
    else:
        size = sum(r[9] for r in conn.execute(KEYS_TABLES).fetchall())
    # The period must have ended (and with it its records) before a sweep drops it.
    sleep_until(hi.timestamp() + 0.5)
    conn.execute("CHECKPOINT")
    load = Load(a, os.path.join(a.out, "claims"), a.chunk)
    time.sleep(a.base)
    dead_before = dead_tuples(conn)
    wal0 = conn.execute(WAL).fetchone()[0]
    notices.clear()
    # A sweep that cannot have its locks within 100 ms leaves the drop to the next sweep (a
    # NOTICE says so): the sweeps go on, a second apart, until the period is gone (10 at most).
    attempts = []
    while True:
        t1 = time.time()
        conn.execute("CALL idempotency.idem_sweep_all()")
        t2 = time.time()
        attempts.append((t1, t2))
        if name is None or len(attempts) == 10:
            break
        if conn.execute("SELECT to_regclass(%s) IS NULL", (name,)).fetchone()[0]:
            break
        time.sleep(1)
    wal1 = conn.execute(WAL).fetchone()[0]
    time.sleep(a.after)
    if not load.finish():
        print(f"simulate: pgbench failed, see {a.out}/claims.*.out", file=sys.stderr)
        return 1
    dead_after = dead_tuples(conn)
    gone = name is not None and conn.execute("SELECT to_regclass(%s) IS NULL", (name,)).fetchone()[0]
    left = conn.execute("SELECT count(*) FROM idempotency.keys WHERE expires_at < %s", (hi,)).fetchone()[0]
    claims = read_claims(a.out)
    base = [c[2] for c in claims if attempts[0][0] - a.base <= c[1] < attempts[0][0]]
    during, _ = split_by_windows(claims, attempts)
    deleted = sum(int(m.group(1)) for n in notices for m in [re.search(r"deleted (\d+)", n)] if m)
    result = {"mode": a.mode, "rows": a.rows, "notices": list(notices), "fill_seconds": round(fill_s, 1),
              "bytes": size, "partition": name,
              "statement_seconds": round(t2 - t1, 4), "sweeps": len(attempts),
              "sweeps_seconds": [round(y - x, 4) for x, y in attempts], "dropped": bool(gone), "deleted": deleted,
              "records_left": left, "wal_bytes": wal1 - wal0, "dead_before": dead_before, "dead_after": dead_after,
              "rate": a.rate, "clients": a.clients, "base_seconds": a.base,
              "claims_before": len(base), "p99_before_ms": pct(base, 99),
              "claims_during": len(during), "p99_during_ms": pct(during, 99),
              "max_during_ms": max(during, default=None)}
    json.dump(result, open(os.path.join(a.out, "drop.json"), "w"), indent=1)
    print(f"  drop ({a.mode}): {json.dumps(result)}", flush=True)
    return 0


# --- the report ---------------------------------------------------------------------------------

def read_tsv(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        return [dict(zip(header, line.rstrip("\n").split("\t"), strict=False)) for line in f if line.strip()]


def fmt(v, digits=2):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:,.{digits}f}"


def mb(v):
    return f"{v / 1048576:,.1f}"


def goal(ok, text):
    return f"- {'**met**' if ok else '**not met**'}: {text}"


def report(out):
    designs = [d for d in sorted(os.listdir(out)) if os.path.exists(os.path.join(out, d, "run.json"))]
    meta = {d: json.load(open(os.path.join(out, d, "run.json"))) for d in designs}
    designs.sort(key=lambda d: meta[d].get("order", 0))
    all_rows, day_rows, lines, goals = [], [], [], []
    for d in designs:
        m = meta[d]
        kind = m["kind"]
        claims = read_claims(os.path.join(out, d))
        sweeps = read_tsv(os.path.join(out, d, "sweeps.tsv"))
        samples, tables = read_tsv(os.path.join(out, d, "samples.tsv")), read_tsv(os.path.join(out, d, "tables.tsv"))
        rows = period_rows(d, m, samples, tables, sweeps, claims)
        all_rows += rows
        windows = [(float(s["start"]), float(s["end"])) for s in sweeps if expiring(s, kind)]
        during, without = split_by_windows(claims, windows)
        p_during, p_without = pct(during, 99), pct(without, 99)
        days = read_tsv(os.path.join(out, d, "days.tsv"))
        for r in days:
            r["design"] = d
            r["ratio"] = int(r["total_bytes"]) / int(r["live_bytes"]) if int(r["live_bytes"]) else float("nan")
        day_rows += days
        lines += [f"### {d}: {m.get('description', '')}\n",
                  f"{m['days']} simulated days of {m['day']} s ({m['periods']} periods of {m['period']:g} s each), "
                  f"claims + completes at {m['rate']}/s from {m['clients']} clients, CALL idem_sweep_all() every "
                  f"{m['sweep_every']:g} s. Each row: one period; size and dead tuples at its end.\n",
                  "| period | day | claims/s | p50 ms | p99 ms | p99 own ms | WAL MB | dead tuples | table + index MB "
                  "| partitions | autovacuums | sweeps' ms | longest sweep ms | rows deleted | periods dropped |",
                  "|" + " ---: |" * 15]
        for r in rows:
            lines.append(f"| {r['period']} | {r['day']:.2f} | {r['tps']:,.0f} | {fmt(r['p50_ms'])} "
                         f"| {fmt(r['p99_ms'])} | {fmt(r['p99_own_ms'])} | {mb(r['wal_bytes'])} | {r['dead_tuples']:,} "
                         f"| {mb(r['total_bytes'])} | {r['partitions']} | {r['autovacuums']} | {r['expiry_ms']:,.1f} "
                         f"| {r['expiry_max_ms']:,.1f} | {r['deleted']:,} | {r['dropped']} |")
        lines += ["", "| end of day | live records | their own size MB | table + index MB | ratio |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for r in days:
            lines.append(f"| {r['day']} | {int(r['live_rows']):,} | {mb(int(r['live_bytes']))} "
                         f"| {mb(int(r['total_bytes']))} | **{r['ratio']:.2f}x** |")
        lines.append("")
        lines.append(f"Claims overlapping a sweep that expired records ({len(windows)} such sweeps): "
                     f"{len(during):,} claims, p99 {fmt(p_during)} ms; the other {len(without):,} claims: "
                     f"p99 {fmt(p_without)} ms.\n")
        if p_during is not None and p_without:
            r = p_during / p_without
            goals.append(goal(r <= GOAL_P99_DURING_OVER_WITHOUT,
                              f"{d}: claims' p99 while records expire {fmt(p_during)} ms, {r:.2f}x their p99 without "
                              f"({fmt(p_without)} ms; goal <= {GOAL_P99_DURING_OVER_WITHOUT}x; {len(during)} claims "
                              f"during {len(windows)} expiring sweeps)"))
        steady = [r for r in days if int(r["day"]) >= 2]
        if steady:
            worst = max(r["ratio"] for r in steady)
            sizes = [int(r["total_bytes"]) for r in steady]
            goals.append(goal(worst <= GOAL_SIZE_OVER_LIVE,
                              f"{d}: table + index size at the end of days {steady[0]['day']}-{steady[-1]['day']} "
                              f"{', '.join(mb(s) for s in sizes)} MB, at most {worst:.2f}x the live records' own size "
                              f"(goal <= {GOAL_SIZE_OVER_LIVE}x, flat: last / first {sizes[-1] / sizes[0]:.2f}x)"))
    drops = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name, "drop.json")
        if os.path.exists(path):
            drops.append(json.load(open(path)))
    if drops:
        lines += ["### Expiring a period's records at once\n",
                  "| design | records | their size MB | the sweep's statement s | sweeps | WAL MB "
                  "| dead tuples before → after | claims/s | p99 ms before | p99 ms during (claims) | max ms during |",
                  "| --- |" + " ---: |" * 10]
        for x in drops:
            lines.append(f"| {x['mode']} | {x['rows']:,} | {mb(x['bytes'])} | **{x['statement_seconds']:.3f}** "
                         f"| {x['sweeps']} | {mb(x['wal_bytes'])} | {x['dead_before']:,} → {x['dead_after']:,} "
                         f"| {x['rate']} "
                         f"| {fmt(x['p99_before_ms'])} | {fmt(x['p99_during_ms'])} ({x['claims_during']}) "
                         f"| {fmt(x['max_during_ms'])} |")
            if x["mode"] == "partitions":
                ok = x["statement_seconds"] < GOAL_DROP_SECONDS and x["dead_after"] == 0 and x["dropped"]
                tries = f" (by sweep {x['sweeps']}, a second apart: {x['sweeps_seconds']} s)" if x["sweeps"] > 1 else ""
                gone = "dropped" if x["dropped"] else "NOT dropped"
                goals.append(goal(ok, f"expiring a period of {x['rows']:,} records: {x['statement_seconds']:.3f} s of "
                                  f"statement time{tries} (goal < {GOAL_DROP_SECONDS:g} s), {x['dead_after']:,} dead "
                                  f"tuples after it (goal 0), the period {gone}"))
            if x["p99_during_ms"] and x["p99_before_ms"]:
                r = x["p99_during_ms"] / x["p99_before_ms"]
                goals.append(goal(r <= GOAL_P99_DURING_OVER_WITHOUT,
                                  f"{x['mode']}, {x['rows']:,} records expiring at once: claims' p99 during it "
                                  f"{r:.2f}x the {x['base_seconds']} s before ({x['claims_during']} claims during it)"))
        lines.append("")
    cols = list(all_rows[0].keys()) if all_rows else []
    write_tsv(os.path.join(out, "periods.tsv"), cols, all_rows)
    write_tsv(os.path.join(out, "days.tsv"), ["design", "day", "live_rows", "live_bytes", "total_bytes", "ratio"],
              [{**r, "ratio": f"{r['ratio']:.3f}"} for r in day_rows])
    text = "\n".join(["## Goals (issue 35)\n"] + goals + [""] + lines) + "\n"
    with open(os.path.join(out, "summary.md"), "a") as f:
        f.write(text)
    print(text)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "drop"):
        p = sub.add_parser(name)
        p.add_argument("--host", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--db", required=True)
        p.add_argument("--pgbench", required=True)
        p.add_argument("--script", required=True)
        p.add_argument("--rate", type=float, required=True)
        p.add_argument("--clients", type=int, default=4)
        p.add_argument("--out", required=True)
    r = sub.choices["run"]
    r.add_argument("--design", required=True)
    r.add_argument("--kind", choices=["partitions", "delete"], required=True)
    r.add_argument("--description", default="")
    r.add_argument("--order", type=int, default=0)
    r.add_argument("--day", type=float, required=True)
    r.add_argument("--periods", type=int, required=True)
    r.add_argument("--days", type=int, required=True)
    r.add_argument("--sweep-every", type=float, required=True)
    d = sub.choices["drop"]
    d.add_argument("--mode", choices=["partitions", "delete"], required=True)
    d.add_argument("--rows", type=int, required=True)
    d.add_argument("--base", type=float, default=20, help="seconds of claims before the sweep")
    d.add_argument("--after", type=float, default=3, help="seconds of claims after it")
    d.add_argument("--chunk", type=float, default=5, help="seconds of each pgbench run of the claims")
    sub.add_parser("report").add_argument("out")
    a = ap.parse_args(argv)
    if a.cmd == "report":
        return report(a.out)
    return run(a) if a.cmd == "run" else drop(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
