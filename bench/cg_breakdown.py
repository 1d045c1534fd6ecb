#!/usr/bin/python3
"""Per-operation instruction costs from two callgrind runs of N and 2N operations.

  cg_breakdown.py N PREFIX [PREFIX...]
PREFIX.n1.cg and PREFIX.n2.cg are the runs; for each PREFIX this prints, as a Markdown
table, the cost of one more operation of: the whole statement, chosen functions (inclusive)
and each shared object (self cost, summed over its functions). Standard library only; reads
`callgrind_annotate` output.
"""
import collections
import re
import subprocess
import sys

FUNCS = [
    ("idem_claim_wait_token_wrapper", "idem_claim (inclusive)"),  # 0.4.0 on (0.1.0-0.3.0: src/api/compat.rs)
    ("idem_complete_wrapper", "idem_complete (inclusive)"),
    ("idem_seen_wrapper", "idem_seen (inclusive)"),
    ("idem_fingerprint_wrapper", "idem_fingerprint (inclusive)"),
    ("plpgsql_call_handler", "PL/pgSQL function (inclusive)"),
    ("SPI_execute_plan", "SPI_execute_plan: executor of our statements"),
    ("SPI_execute_plan_with_paramlist", "SPI_execute_plan_with_paramlist (PL/pgSQL's)"),
    ("GetCachedPlan", "GetCachedPlan (plan cache check / custom plans)"),
    ("ExecConstraints", "ExecConstraints (CHECK constraints, parsed per statement)"),
    ("ExecInsertIndexTuples", "ExecInsertIndexTuples (index entries)"),
    ("index_getnext_slot", "index_getnext_slot (index scans)"),
    ("heap_insert", "heap_insert"),
    ("heap_update", "heap_update"),
    ("SPI_connect", "SPI_connect"),
    ("SPI_finish", "SPI_finish"),
    ("get_call_result_type", "get_call_result_type"),
    ("heap_form_tuple", "heap_form_tuple"),
    ("pg_strong_random", "pg_strong_random (tokens)"),
    ("jsonb_out", "jsonb_out (jsonb to text)"),
    ("JsonbToCString", "JsonbToCString"),
    ("pg_detoast_datum_copy", "pg_detoast_datum_copy"),
    ("CommitTransactionCommand", "CommitTransactionCommand"),
    ("printtup", "printtup (single-user output)"),
]


def annotate(path, inclusive):
    args = ["callgrind_annotate", "--threshold=100", path]
    if inclusive:
        args.insert(1, "--inclusive=yes")
    out = subprocess.run(args, capture_output=True, text=True).stdout
    costs, total = {}, 0
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+)(?: \([^)]*\))?\s+(\S.*)$", line)
        if not m:
            continue
        n = int(m.group(1).replace(",", ""))
        rest = m.group(2)
        if rest.startswith("PROGRAM TOTALS"):
            total = n
            continue
        fm = re.match(r"^(.*?):(.+?) \[(.+)\]$", rest)
        if fm:
            func, obj = fm.group(2), fm.group(3)
            costs[(func, obj)] = costs.get((func, obj), 0) + n
    return total, costs


def main():
    n = int(sys.argv[1])
    for prefix in sys.argv[2:]:
        t1, inc1 = annotate(prefix + ".n1.cg", True)
        t2, inc2 = annotate(prefix + ".n2.cg", True)
        _, self1 = annotate(prefix + ".n1.cg", False)
        _, self2 = annotate(prefix + ".n2.cg", False)
        per_op = (t2 - t1) / n
        name = prefix.rsplit("/", 1)[-1]
        print(f"#### {name}: {per_op:,.0f} instructions per operation\n")
        print("| part | instructions per operation | share |")
        print("| --- | ---: | ---: |")

        def func_cost(costs, fname):
            return sum(v for (f, _), v in costs.items() if f == fname)

        for fname, label in FUNCS:
            d = (func_cost(inc2, fname) - func_cost(inc1, fname)) / n
            if d > per_op * 0.005:
                print(f"| {label} | {d:,.0f} | {d / per_op * 100:.0f} % |")
        objs = collections.Counter()
        for (_f, obj), v in self2.items():
            objs[obj.rsplit("/", 1)[-1]] += v
        for (_f, obj), v in self1.items():
            objs[obj.rsplit("/", 1)[-1]] -= v
        for obj, v in objs.most_common(6):
            d = v / n
            if d > per_op * 0.005:
                print(f"| self cost in {obj} | {d:,.0f} | {d / per_op * 100:.0f} % |")
        # The functions whose own (self) cost grew most per operation.
        grown = collections.Counter()
        for k, v in self2.items():
            grown[k] += v
        for k, v in self1.items():
            grown[k] -= v
        top = ", ".join(f"{f.split('::')[-1]} {v / n:,.0f}" for (f, _), v in grown.most_common(12))
        print(f"\nTop self costs per operation: {top}.\n")


if __name__ == "__main__":
    main()
