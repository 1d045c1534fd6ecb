#!/usr/bin/python3
"""Throughput and latency percentiles from pgbench per-transaction logs (pgbench -l).

Standard library only. A pgbench -l log line (PostgreSQL 15) is
    client_id transaction_no time script_no time_epoch time_us [schedule_lag] [retries]
where `time` is the transaction's latency in microseconds ("failed" / "skipped" otherwise)
and time_epoch.time_us is when it ended. With --log-prefix P, thread 0 writes P.<pid> and
thread n writes P.<pid>.<n>.

  latency.py summarize RESULTS_DIR
      reads RESULTS_DIR/runs.tsv (written by bench/run.sh), the logs it names and writes.tsv
      (run.sh's warm-page step); writes RESULTS_DIR/summary.tsv, percentiles.tsv (the latency
      at fixed percentiles, for bench/plot.py) and summary.md (with issues 34's and 35's goals
      where the run has their figures) and prints the Markdown.
  latency.py releases RESULTS_DIR
      reads RESULTS_DIR/runs.tsv written by bench/releases.sh (a release column, old or new,
      instead of impl); writes summary.tsv and summary.md (medians of the rounds, new/old).
  latency.py window PREFIX [PREFIX...] [--from EPOCH] [--to EPOCH]
      one JSON object: n, tps, p50_ms, p99_ms, max_ms of the transactions of those logs that
      ended inside the window (all of them without --from/--to); for logs of pgbench --rate
      also p50_service_ms and p99_service_ms, the latencies less the schedule lag.
"""
import glob
import json
import math
import os
import statistics
import sys


def read_logs(prefix, t_from=None, t_to=None, service=None):
    """(latencies in µs, failures, first start, last end) of the logs written with this prefix.
    With pgbench --rate a line also has the schedule lag (how late the transaction started);
    when `service` is a list, each latency minus its lag (the transaction's own time) goes there."""
    lat, failed, first, last = [], 0, math.inf, -math.inf
    for path in glob.glob(glob.escape(prefix) + ".*"):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6:
                    continue  # a partial last line
                try:
                    end = int(parts[4]) + int(parts[5]) / 1e6
                except ValueError:
                    continue
                if (t_from is not None and end < t_from) or (t_to is not None and end > t_to):
                    continue
                if not parts[2].isdigit():
                    failed += 1
                    continue
                us = int(parts[2])
                lat.append(us)
                if service is not None and len(parts) >= 7 and parts[6].isdigit():
                    service.append(us - int(parts[6]))
                first = min(first, end - us / 1e6)
                last = max(last, end)
    return lat, failed, first, last


def pct(sorted_values, p):
    """Nearest-rank percentile."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def window(prefixes, t_from=None, t_to=None):
    lat, failed, first, last, service = [], 0, math.inf, -math.inf, []
    for p in prefixes:
        lats, f, a, b = read_logs(p, t_from, t_to, service)
        lat += lats
        failed += f
        first, last = min(first, a), max(last, b)
    lat.sort()
    span = (t_to - t_from) if (t_from is not None and t_to is not None) else (last - first)
    return {
        "n": len(lat),
        "failed": failed,
        "seconds": round(span, 3) if lat else 0,
        "tps": round(len(lat) / span, 1) if lat and span > 0 else 0,
        "p50_ms": round(pct(lat, 50) / 1000, 3) if lat else None,
        "p99_ms": round(pct(lat, 99) / 1000, 3) if lat else None,
        "max_ms": round(lat[-1] / 1000, 3) if lat else None,
        # Without the schedule lag (logs of pgbench --rate only): the transactions' own time.
        "p50_service_ms": round(pct(sorted(service), 50) / 1000, 3) if service else None,
        "p99_service_ms": round(pct(sorted(service), 99) / 1000, 3) if service else None,
    }


SCENARIOS = ["claim_complete", "partitions", "replay", "in_progress", "mismatch", "seen_new", "seen_dup",
             "fp_1k", "fp_64k"]
IMPLS = ["ext", "ext_deferred", "ext_committed", "ext_spi", "peer", "floor", "portable", "limit", "p1", "p3"]
IMPL_NAMES = {"ext": "extension", "ext_deferred": "extension, deferred", "ext_committed": "extension, committed first",
              "ext_spi": "extension, SPI read path", "peer": "PL/pgSQL peer",
              "floor": "raw SQL floor", "portable": "portable edition", "limit": "limit: bare PK SELECT",
              "p1": "records in 1 period", "p3": "records in 3 periods"}
# The limit's name where the scenario writes: one bare INSERT of the completed row.
LIMIT_WRITE_NAME = "limit: one bare INSERT"
# The implementations summary.md compares with the others (ratio columns on their rows).
COMPARED = ["ext", "ext_deferred", "ext_committed", "ext_spi"]
# The latency percentiles percentiles.tsv holds (bench/plot.py draws them).
PERCENTILES = [0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 100]
# Issues 34 and 35: the goals a bench/run.sh summary can say met or not.
GOAL_TPS_OVER_FLOOR = 1.0
GOAL_TPS_OVER_LIMIT = 0.85
GOAL_WAL_OVER_LIMIT = 1.15
GOAL_P3_OVER_P1 = 0.9
OTHERS = ["peer", "floor", "portable", "limit"]


def impl_name(impl, scenario):
    if impl == "limit" and scenario in ("claim_complete", "partitions"):
        return LIMIT_WRITE_NAME
    return IMPL_NAMES.get(impl, impl)


def read_tsv(path):
    """The rows of a tab-separated file with a header line, as dicts ([] when it is missing)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        return [dict(zip(header, line.rstrip("\n").split("\t"), strict=False)) for line in f if line.strip()]


def writes_section(results):
    """writes.tsv (run.sh's warm-page step): per implementation, WAL bytes and table writes per
    request, and the WAL against the limit's one INSERT. Returns (Markdown lines, rows by (pg, impl))."""
    rows = read_tsv(os.path.join(results, "writes.tsv"))
    by = {}
    for r in rows:
        n = int(r["transactions"])
        by[(r["pg"], r["impl"])] = {k: int(r[k]) / n for k in ("wal_bytes", "ins", "upd", "hot_upd", "del", "dead")}
    if not by:
        return [], by
    out = ["#### Writes per request: claim_complete, warm pages\n",
           "| PostgreSQL | implementation | WAL B/req | WAL / limit | inserts | updates | HOT updates | deletes "
           "| n_dead_tup change |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (pg, impl), w in sorted(by.items(), key=lambda kv: (kv[0][0], IMPLS.index(kv[0][1]))):
        lim = by.get((pg, "limit"))
        ratio = f"**{w['wal_bytes'] / lim['wal_bytes']:.2f}x**" if lim and lim["wal_bytes"] else "—"
        out.append(f"| {pg} | {impl_name(impl, 'claim_complete')} | {w['wal_bytes']:,.0f} | {ratio} | {w['ins']:.3f} "
                   f"| {w['upd']:.3f} | {w['hot_upd']:.3f} | {w['del']:.3f} | {w['dead']:.3f} |")
    n = rows[0]["transactions"]
    out += ["", f"One client, {n} transactions measured after a warm-up, with full_page_writes off meanwhile: "
            "the WAL records themselves, as on pages already written since the last checkpoint (the main "
            "table's WAL B/txn column includes the full-page images after each run's CHECKPOINT); WAL from "
            "pg_current_wal_insert_lsn, the rest from pg_stat_user_tables summed over the database's tables "
            "(the extension's partitions, the floor's table), per request. n_dead_tup change: dead row versions "
            "left (autovacuum, when it runs meanwhile, takes some away).", ""]
    return out, by


def goal(ok, text):
    return f"- {'**met**' if ok else '**not met**'}: {text}"


def goals_section(by, writes):
    """Issues 34 and 35's goals that this run measured, each met or not."""
    out = []
    for pg, clients, scenario, impl in sorted(k for k in by if k[2] == "claim_complete" and k[3] == "ext_deferred"):
        d = by[(pg, clients, scenario, impl)]
        for other, want in (("floor", GOAL_TPS_OVER_FLOOR), ("limit", GOAL_TPS_OVER_LIMIT)):
            o = by.get((pg, clients, scenario, other))
            if o and o["tps"]:
                r = d["tps"] / o["tps"]
                out.append(goal(r >= want, f"{clients} clients{', PostgreSQL ' + pg if pg else ''}: claim + complete "
                                f"(deferred) {r:.2f}x the {impl_name(other, scenario)}'s tps (goal >= {want}x)"))
    for (pg, impl), w in sorted(writes.items()):
        if impl != "ext_deferred":
            continue
        lim = writes.get((pg, "limit"))
        if lim and lim["wal_bytes"]:
            r = w["wal_bytes"] / lim["wal_bytes"]
            out.append(goal(r <= GOAL_WAL_OVER_LIMIT,
                            f"PostgreSQL {pg}: WAL per fresh request {w['wal_bytes']:,.0f} B, {r:.2f}x one INSERT "
                            f"of the same row ({lim['wal_bytes']:,.0f} B; goal <= {GOAL_WAL_OVER_LIMIT}x)"))
        out.append(goal(w["upd"] == 0 and w["dead"] <= 0 and w["del"] == 0,
                        f"PostgreSQL {pg}: {w['upd']:.3f} updates, {w['del']:.3f} deletes and {w['dead']:.3f} dead "
                        "tuples per same-transaction request (goal 0)"))
    for pg, clients, scenario, impl in sorted(k for k in by if k[2] == "partitions" and k[3] == "p3"):
        one = by.get((pg, clients, scenario, "p1"))
        if one and one["tps"]:
            r = by[(pg, clients, scenario, impl)]["tps"] / one["tps"]
            out.append(goal(r >= GOAL_P3_OVER_P1,
                            f"{clients} clients{', PostgreSQL ' + pg if pg else ''}: claim + complete with records "
                            f"in 3 periods {r:.2f}x with all in one (goal >= {GOAL_P3_OVER_P1}x)"))
    if out:
        out = ["#### Goals (issues 34 and 35)\n"] + out + [""]
    return out


def fmt(x, digits=1):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}"


def across_majors(rows, by):
    """With runs on several majors: each implementation's tps and p99 on each, and the ratio of
    the last major to the first (the implementations and majors alternated within each round)."""
    majors = sorted({r["pg"] for r in rows if r["pg"]}, key=int)
    if len(majors) < 2:
        return []
    first, last = majors[0], majors[-1]
    out = [f"#### PostgreSQL {last} against {first}\n",
           f"| clients | scenario | implementation | tps {first} | tps {last} | {last}/{first} tps "
           f"| p99 ms {first} | p99 ms {last} |",
           "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r["pg"] != first:
            continue
        o = by.get((last, r["clients"], r["scenario"], r["impl"]))
        if not o:
            continue
        ratio = f"**{o['tps'] / r['tps']:.2f}x**" if r["tps"] else "—"
        out.append(f"| {r['clients']} | {r['scenario']} | {IMPL_NAMES.get(r['impl'], r['impl'])} | {fmt(r['tps'], 0)} "
                   f"| {fmt(o['tps'], 0)} | {ratio} | {fmt(r['p99_ms'], 3)} | {fmt(o['p99_ms'], 3)} |")
    out.append("")
    return out


def summarize(results):
    runs = []
    with open(os.path.join(results, "runs.tsv")) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            runs.append(dict(zip(header, line.rstrip("\n").split("\t"), strict=False)))
    groups = {}
    for r in runs:
        lat, failed, first, last = read_logs(os.path.join(results, r["log_prefix"]))
        n = len(lat)
        span = last - first if n else 0
        r["n"], r["failed"] = n, failed
        r["tps_log"] = n / span if span > 0 else 0.0
        # runs.tsv of run.sh before 0.6.0 has no table counts.
        for k in ("ins", "upd", "hot_upd", "del", "dead"):
            r[k] = int(r.get(k) or 0)
        # runs.tsv of a run over several majors has a pg column; older ones do not.
        groups.setdefault((r.get("pg", ""), int(r["clients"]), r["scenario"], r["impl"]), []).append((r, lat))

    rows, percentiles = [], {}
    for (pg, clients, scenario, impl), items in sorted(
        groups.items(),
        key=lambda kv: (kv[0][0], kv[0][1], SCENARIOS.index(kv[0][2]) if kv[0][2] in SCENARIOS else 99,
                        IMPLS.index(kv[0][3]))
    ):
        tps_rounds = [r["tps_log"] for r, _ in items]
        lat = sorted(x for _, lats in items for x in lats)
        n = sum(r["n"] for r, _ in items)
        xids = sum(int(r["xids"]) for r, _ in items)
        wal = sum(int(r["wal_bytes"]) for r, _ in items)
        tps = statistics.mean(tps_rounds) if tps_rounds else 0
        spread = (max(tps_rounds) - min(tps_rounds)) / tps * 100 if tps else 0
        rows.append({
            "pg": pg, "clients": clients, "scenario": scenario, "impl": impl, "rounds": len(items),
            "transactions": n, "failed": sum(r["failed"] for r, _ in items),
            "tps": tps, "tps_spread_pct": spread,
            "p50_ms": pct(lat, 50) / 1000, "p99_ms": pct(lat, 99) / 1000,
            "xids_per_txn": xids / n if n else float("nan"),
            "wal_bytes_per_txn": wal / n if n else float("nan"),
            **{f"{k}_per_txn": sum(r[k] for r, _ in items) / n if n else float("nan")
               for k in ("ins", "upd", "hot_upd", "del", "dead")},
        })
        percentiles[(pg, clients, scenario, impl)] = [pct(lat, p) / 1000 for p in PERCENTILES]

    by = {(r["pg"], r["clients"], r["scenario"], r["impl"]): r for r in rows}
    with open(os.path.join(results, "summary.tsv"), "w") as f:
        cols = list(rows[0].keys()) if rows else []
        ratio_cols = [f"{a}_over_{b}" for a in COMPARED for b in OTHERS]
        f.write("\t".join(cols + ratio_cols) + "\n")
        for r in rows:
            ratios = []
            for a in COMPARED:
                x = by.get((r["pg"], r["clients"], r["scenario"], a))
                for b in OTHERS:
                    o = by.get((r["pg"], r["clients"], r["scenario"], b))
                    ratios.append(f"{x['tps'] / o['tps']:.3f}" if x and o and o["tps"] else "nan")
            f.write("\t".join(str(round(r[c], 4) if isinstance(r[c], float) else r[c]) for c in cols)
                    + "\t" + "\t".join(ratios) + "\n")
    with open(os.path.join(results, "percentiles.tsv"), "w") as f:
        f.write("pg\tclients\tscenario\timpl\t" + "\t".join(f"p{p:g}_ms" for p in PERCENTILES) + "\n")
        for (pg, clients, scenario, impl), values in percentiles.items():
            f.write(f"{pg}\t{clients}\t{scenario}\t{impl}\t" + "\t".join(f"{v:.4f}" for v in values) + "\n")

    out = []
    for pg, clients in sorted({(r["pg"], r["clients"]) for r in rows}):
        out.append(f"#### {'PostgreSQL ' + pg + ', ' if pg else ''}{clients} clients\n")
        out.append("| scenario | implementation | tps | spread | p50 ms | p99 ms | xids/txn | WAL B/txn "
                   "| tps / peer | tps / floor | tps / portable | tps / limit |")
        out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            if (r["pg"], r["clients"]) != (pg, clients):
                continue
            cells = [""] * len(OTHERS)
            if r["impl"] in COMPARED:
                cells = []
                for other in OTHERS:
                    o = by.get((pg, clients, r["scenario"], other))
                    cells.append(f"**{r['tps'] / o['tps']:.2f}x**" if o and o["tps"] else "—")
            failed = f" ({r['failed']} failed)" if r["failed"] else ""
            out.append(
                f"| {r['scenario']} | {impl_name(r['impl'], r['scenario'])}{failed} | {fmt(r['tps'], 0)} | "
                f"±{r['tps_spread_pct'] / 2:.0f}% | {fmt(r['p50_ms'], 3)} | {fmt(r['p99_ms'], 3)} | "
                f"{fmt(r['xids_per_txn'], 3)} | {fmt(r['wal_bytes_per_txn'], 0)} | "
                f"{' | '.join(cells)} |"
            )
        out.append("")
    out.extend(across_majors(rows, by))
    writes, writes_by = writes_section(results)
    out.extend(writes)
    out.extend(goals_section(by, writes_by))
    out.append("tps: transactions per second from the logs, mean of the rounds; spread: half the range "
               "of the rounds' tps, relative to the mean; p50 / p99: over every transaction of every "
               "round; xids/txn and WAL B/txn: transaction ids assigned and WAL written during the "
               "runs, per transaction (background activity included); tps / peer ... tps / limit: on the "
               "rows of the extension (each read path), its tps over the other implementation's.")
    text = "\n".join(out) + "\n"
    with open(os.path.join(results, "summary.md"), "w") as f:
        f.write(text)
    print(text)


def releases(results):
    """bench/releases.sh: per client count and scenario, the old and the new release's median tps
    of the rounds, new/old, and the range of the per-round ratios (round r's new over round r's
    old: the runs of a round are back to back, so this range is the noise of the comparison)."""
    with open(os.path.join(results, "runs.tsv")) as f:
        header = f.readline().rstrip("\n").split("\t")
        runs = [dict(zip(header, line.rstrip("\n").split("\t"), strict=False)) for line in f]
    groups, versions = {}, {}
    for r in runs:
        lat, failed, first, last = read_logs(os.path.join(results, r["log_prefix"]))
        r["lat"], r["failed"] = lat, failed
        r["tps_log"] = len(lat) / (last - first) if lat and last > first else 0.0
        versions[r["release"]] = r["version"]
        groups.setdefault((int(r["clients"]), r["scenario"]), {}).setdefault(r["release"], {})[r["round"]] = r

    def side(rounds):
        lat = sorted(x for r in rounds.values() for x in r["lat"])
        return {"tps": statistics.median(r["tps_log"] for r in rounds.values()),
                "failed": sum(r["failed"] for r in rounds.values()),
                "p50_ms": pct(lat, 50) / 1000, "p99_ms": pct(lat, 99) / 1000}

    old, new = versions.get("old", "old"), versions.get("new", "new")
    rows = []
    for (clients, scenario), by_release in sorted(
        groups.items(), key=lambda kv: (kv[0][0], SCENARIOS.index(kv[0][1]) if kv[0][1] in SCENARIOS else 99)
    ):
        if "old" not in by_release or "new" not in by_release:
            continue
        o, n = side(by_release["old"]), side(by_release["new"])
        paired = [by_release["new"][k]["tps_log"] / by_release["old"][k]["tps_log"]
                  for k in by_release["new"] if k in by_release["old"] and by_release["old"][k]["tps_log"]]
        rows.append({"clients": clients, "scenario": scenario, "rounds": len(paired),
                     "tps_old": o["tps"], "tps_new": n["tps"],
                     "new_over_old": n["tps"] / o["tps"] if o["tps"] else float("nan"),
                     "round_ratio_min": min(paired, default=float("nan")),
                     "round_ratio_max": max(paired, default=float("nan")),
                     "p50_ms_old": o["p50_ms"], "p50_ms_new": n["p50_ms"],
                     "p99_ms_old": o["p99_ms"], "p99_ms_new": n["p99_ms"],
                     "failed": o["failed"] + n["failed"]})

    with open(os.path.join(results, "summary.tsv"), "w") as f:
        cols = list(rows[0].keys()) if rows else []
        f.write("\t".join(cols) + "\n")
        for r in rows:
            f.write("\t".join(str(round(r[c], 4) if isinstance(r[c], float) else r[c]) for c in cols) + "\n")
    out = [f"#### {new} against {old}, alternating\n",
           f"| clients | scenario | tps {old} | tps {new} | {new}/{old} | per-round {new}/{old} "
           f"| p50 ms {old} | p50 ms {new} | p99 ms {old} | p99 ms {new} |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        out.append(f"| {r['clients']} | {r['scenario']}{failed} | {fmt(r['tps_old'], 0)} | {fmt(r['tps_new'], 0)} "
                   f"| **{r['new_over_old']:.2f}x** | {r['round_ratio_min']:.2f}-{r['round_ratio_max']:.2f} "
                   f"| {fmt(r['p50_ms_old'], 3)} | {fmt(r['p50_ms_new'], 3)} "
                   f"| {fmt(r['p99_ms_old'], 3)} | {fmt(r['p99_ms_new'], 3)} |")
    out.append("")
    out.append("tps: transactions per second from the logs, median of the rounds; per-round: the lowest and "
               "the highest of each round's new tps over the same round's old tps (the two runs of a round "
               "are back to back); p50 / p99: over every transaction of every round.")
    text = "\n".join(out) + "\n"
    with open(os.path.join(results, "summary.md"), "w") as f:
        f.write(text)
    print(text)


def main(argv):
    if len(argv) >= 2 and argv[0] == "summarize":
        summarize(argv[1])
    elif len(argv) >= 2 and argv[0] == "releases":
        releases(argv[1])
    elif len(argv) >= 2 and argv[0] == "window":
        prefixes, t_from, t_to, i = [], None, None, 1
        while i < len(argv):
            if argv[i] == "--from":
                t_from = float(argv[i + 1])
                i += 2
            elif argv[i] == "--to":
                t_to = float(argv[i + 1])
                i += 2
            else:
                prefixes.append(argv[i])
                i += 1
        print(json.dumps(window(prefixes, t_from, t_to)))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
