#!/usr/bin/env python3
"""The parity check: a fresh native install, a fresh portable install and the contract.

    compare.py --native N.txt --portable P.txt --contract contract/contract.json --allowed allowed.txt
    compare.py --self-test

N.txt and P.txt are tests/upgrade/describe.sql's output for the two installs. Compared are
the lines a caller sees (signatures, columns, relations, types, constraints, indexes, views),
not the functions' bodies, which are each edition's own. Prints one line per check, "ok
NAME", "FAIL NAME" (details indented below it) or "skip NAME: WHY", for tests/parity/run.sh
to count.
"""

import argparse
import io
import json
import re
import sys

# The kinds of describe.sql's lines that both editions must print alike.
COMPARED_KINDS = ("signature", "column", "relation", "type", "constraint", "index", "view")
SCHEMA = "idempotency."
TYPE_ALIASES = {
    "int": "integer", "int4": "integer", "int8": "bigint", "bool": "boolean",
    "timestamptz": "timestamp with time zone", "varchar": "character varying",
}
SIGNATURE_TAIL = re.compile(
    r"^(?: returns (?P<returns>.*?))? (?P<volatility>volatile|stable|immutable)(?P<strict> strict)?"
    r" parallel (?P<parallel>safe|restricted|unsafe)(?P<definer> security definer)?(?P<procedure> procedure)?$")


def split_top_level(text):
    """Splits "a int, b text DEFAULT 'x, y'::text" at the commas outside quotes and parentheses."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append(text[start:i].strip())
            start = i + 1
    last = text[start:].strip()
    return parts + [last] if last else parts


def closing_paren(text, open_at):
    depth, quoted = 0, False
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"no closing parenthesis in {text!r}")


def norm_type(t):
    t = t.strip().lower()
    t = t.removeprefix(SCHEMA)
    array = t.endswith("[]")
    base = t[:-2] if array else t
    return TYPE_ALIASES.get(base, base) + ("[]" if array else "")


def norm_default(d):
    """A default as pg_get_function_arguments prints it, without its casts: NULL::text -> NULL."""
    if d is None:
        return None
    d = d.strip()
    while True:
        m = re.match(r"^(.*)::[a-z ]+(\[\])?$", d, re.DOTALL)
        if not m:
            return d
        d = m.group(1)


INTERVAL_UNITS = {"ms": 0.001, "millisecond": 0.001, "s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60,
                  "h": 3600, "hour": 3600, "day": 86400}


def interval_seconds(literal):
    """'4 ms', '5 minutes', '1 day 02:00:00', '00:00:00.004' -> seconds; None if unreadable."""
    text = literal.strip("'").strip().lower()
    total = 0.0
    parts = re.findall(r"(-?[0-9.]+)\s*([a-z]+)", text)
    for number, unit in parts:
        factor = INTERVAL_UNITS.get(unit.rstrip("s")) or INTERVAL_UNITS.get(unit)
        if factor is None:
            return None
        total += float(number) * factor
    clock = re.search(r"(-?)([0-9]+):([0-9]+):([0-9.]+)$", text)
    if clock:
        sign = -1 if clock.group(1) else 1
        total += sign * (int(clock.group(2)) * 3600 + int(clock.group(3)) * 60 + float(clock.group(4)))
    elif not parts:
        return None
    return total


def same_default(arg):
    """An argument with an interval default as a number of seconds, so that '4 ms' and
    '00:00:00.004' (how PostgreSQL prints it back) compare equal."""
    if arg["type"] == "interval" and arg["default"] not in (None, "NULL"):
        seconds = interval_seconds(arg["default"])
        if seconds is not None:
            return dict(arg, default=f"{seconds:g} s")
    return arg


def parse_column(text):
    """'name type' -> (name, normalized type)."""
    name, _, typ = text.strip().partition(" ")
    return name.strip('"'), norm_type(typ)


def parse_arg(text):
    head, _, default = text.partition(" DEFAULT ")
    words = head.split(" ", 1)
    if words[0] in ("IN", "OUT", "INOUT", "VARIADIC"):
        words = words[1].split(" ", 1)
    name, typ = words[0].strip('"'), words[1]
    return same_default({"name": name, "type": norm_type(typ), "default": norm_default(default) if default else None})


def parse_signature(line):
    """'signature NAME(ARGS)[ returns R] volatility...' -> a dict like contract.json's functions."""
    body = line[len("signature "):]
    open_at = body.index("(")
    close_at = closing_paren(body, open_at)
    m = SIGNATURE_TAIL.match(body[close_at + 1:])
    if not m:
        raise ValueError(f"cannot read {line!r}")
    returns = m.group("returns")
    columns = None
    if returns and returns.startswith("TABLE("):
        columns = [parse_column(c) for c in split_top_level(returns[len("TABLE("):-1])]
        returns = "TABLE"
    elif returns and returns.startswith("SETOF "):
        returns = "SETOF " + norm_type(returns[len("SETOF "):])
    elif returns:
        returns = norm_type(returns)
    return {
        "name": body[:open_at],
        "kind": "procedure" if m.group("procedure") else "function",
        "args": [parse_arg(a) for a in split_top_level(body[open_at + 1:close_at])],
        "returns": returns,
        "columns": columns,
        "volatility": m.group("volatility"),
        "strict": bool(m.group("strict")),
        "parallel": m.group("parallel"),
    }


def contract_function(f):
    """A function of contract.json in parse_signature's form."""
    returns = f.get("returns")
    if returns and returns.startswith("SETOF "):
        returns = "SETOF " + norm_type(returns[len("SETOF "):])
    elif returns and returns != "TABLE":
        returns = norm_type(returns)
    columns = f.get("columns")
    return {
        "name": f["name"],
        "kind": f.get("kind", "function"),
        "args": [same_default({"name": a["name"], "type": norm_type(a["type"]),
                               "default": norm_default(a.get("default"))})
                 for a in f.get("args", [])],
        "returns": returns,
        "columns": [(c["name"], norm_type(c["type"])) for c in columns] if columns else None,
        "volatility": f.get("volatility"),
        "strict": bool(f.get("strict", False)),
        "parallel": f.get("parallel"),
    }


def read_allowed(path):
    """allowed.txt, comments (#) saying why: 'EDITION REGEX' (a line only EDITION has) or
    'EDITION REGEX => REPLACEMENT' (EDITION's lines rewritten before they are compared: a known
    difference inside a line that must otherwise be the same). As (edition, regex, line
    number, replacement or None)."""
    allowed = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            edition, _, rest = line.partition(" ")
            regex, arrow, replacement = rest.partition(" => ")
            if edition not in ("native", "portable") or not regex.strip():
                raise ValueError(f"{path}:{n}: expected 'native|portable REGEX [=> REPLACEMENT]'")
            allowed.append((edition, re.compile(regex.strip()), n, replacement.strip() if arrow else None))
    return allowed


def compared_lines(text):
    return {line for line in text.splitlines() if line.split(" ", 1)[0] in COMPARED_KINDS}


class Report:
    def __init__(self, out=sys.stdout):
        self.out = out
        self.failed = 0

    def check(self, name, problems):
        if problems:
            self.failed += 1
            print(f"FAIL {name}", file=self.out)
            for p in problems[:30]:
                print(f"    {p}", file=self.out)
        else:
            print(f"ok   {name}", file=self.out)

    def skip(self, name, why):
        print(f"skip {name}: {why}", file=self.out)


def compare_editions(native, portable, allowed, report):
    """Lines one edition has and the other lacks: each must be on the allow-list, and each
    entry of the allow-list must still be needed."""
    used = set()

    def rewritten(edition, lines):
        out = set()
        for line in lines:
            for e, rx, n, replacement in allowed:
                if e == edition and replacement is not None:
                    new = rx.sub(replacement, line)
                    if new != line:
                        used.add(n)
                        line = new
            out.add(line)
        return out

    native, portable = rewritten("native", native), rewritten("portable", portable)
    only = {"native": sorted(native - portable), "portable": sorted(portable - native)}
    for edition, lines in only.items():
        unexplained = []
        for line in lines:
            hits = [n for e, rx, n, replacement in allowed if e == edition and replacement is None and rx.search(line)]
            used.update(hits)
            if not hits:
                unexplained.append(line.splitlines()[0][:200])
        report.check(f"parity: every line only the {edition} edition has is on the allow-list "
                     f"({len(lines)} such lines)", unexplained)
    report.check("parity: every allow-list entry is still needed",
                 [f"allowed.txt line {n}: {e} {rx.pattern} matches nothing"
                  for e, rx, n, _ in allowed if n not in used])


def compare_with_contract(edition, lines, contract, allowed, report):
    functions = [parse_signature(line) for line in lines if line.startswith("signature ")]
    own = {line for line in lines if any(e == edition and r is None and rx.search(line) for e, rx, _, r in allowed)}
    if "functions" not in contract:
        report.skip(f"{edition} against contract/contract.json's functions",
                    "the contract has no functions section yet")
    else:
        wanted = [contract_function(f) for f in contract["functions"]
                  if edition in contract_editions(f)]
        problems = []
        for want in wanted:
            if want not in functions:
                same_name = [f for f in functions if f["name"] == want["name"]]
                problems.append(f"contract: {json.dumps(want)}")
                problems += [f"  {edition}: {json.dumps(f)}" for f in same_name] or [f"  {edition}: no such function"]
        for f, line in zip(functions, [line for line in lines if line.startswith("signature ")], strict=False):
            if f not in wanted and line not in own:
                problems.append(f"{edition} has a function the contract does not describe: {line}")
        report.check(f"{edition}: every function as contract/contract.json describes it "
                     f"({len(wanted)} functions)", problems)
    for section in ("tables", "views", "types"):
        if section not in contract:
            report.skip(f"{edition} against contract/contract.json's {section}", "no such section yet")
            continue
        problems = []
        for name, columns in contract[section].items():
            rel = name.removeprefix(SCHEMA)
            got = [parse_column(re.sub(r" not null.*| default .*", "", line.split(" ", 2)[2]))
                   for line in sorted(lines) if line.startswith(f"column {rel}.")]
            want = [(c["name"], norm_type(c["type"])) for c in columns]
            if got != want:
                problems.append(f"{name}: contract {want}")
                problems.append(f"  {edition}: {got}")
        report.check(f"{edition}: the {section}' columns, in order, as contract/contract.json "
                     f"describes them ({len(contract[section])})", problems)


def contract_editions(f):
    return f.get("editions", ["native", "portable"])


def self_test():
    failures = []
    count = [0]

    def expect(name, want, got):
        count[0] += 1
        if want != got:
            failures.append(f"{name}: expected {want!r}, got {got!r}")

    sig = parse_signature("signature idem_claim(scope text, key text, fingerprint text DEFAULT NULL::text, "
                          "pause interval DEFAULT '00:00:00.004'::interval, tags text[] DEFAULT '{a,\"b, c\"}'::text[])"
                          " returns idempotency.claim_result volatile parallel unsafe")
    expect("argument names", ["scope", "key", "fingerprint", "pause", "tags"], [a["name"] for a in sig["args"]])
    expect("defaults without casts, intervals in seconds", [None, None, "NULL", "0.004 s", "'{a,\"b, c\"}'"],
           [a["default"] for a in sig["args"]])
    expect("types", ["text", "text", "text", "interval", "text[]"], [a["type"] for a in sig["args"]])
    expect("result without the schema", "claim_result", sig["returns"])
    table = parse_signature("signature distribute(delegate boolean DEFAULT true) returns TABLE(object text, "
                            "action text) volatile strict parallel restricted")
    expect("TABLE columns", [("object", "text"), ("action", "text")], table["columns"])
    expect("strict, parallel", (True, "restricted"), (table["strict"], table["parallel"]))
    proc = parse_signature(
        "signature idem_sweep_all(batch_size integer DEFAULT 200) volatile parallel unsafe procedure")
    expect("a procedure has no result", ("procedure", None), (proc["kind"], proc["returns"]))
    expect("the contract's form is the same",
           contract_function({"name": "idem_sweep_all", "kind": "procedure", "returns": None, "volatility": "volatile",
                              "strict": False, "parallel": "unsafe",
                              "args": [{"name": "batch_size", "type": "int", "default": "200"}]}), proc)
    expect("intervals as written and as printed", [0.004, 300.0, 93600.0, 0.004, None],
           [interval_seconds(x) for x in ("'4 ms'", "'5 minutes'", "'1 day 02:00:00'", "'00:00:00.004'", "'soon'")])
    out = io.StringIO()
    report = Report(out)
    compare_editions({"signature a() returns text volatile parallel unsafe",
                      "signature n() returns text volatile parallel unsafe",
                      "view v SELECT 1 AS x"},
                     {"signature a() returns text volatile parallel unsafe", "view v SELECT NULLIF(1, 0) AS x"},
                     [("native", re.compile("^signature n\\("), 1, None),
                      ("portable", re.compile("^signature gone"), 2, None),
                      ("portable", re.compile(r"NULLIF\((1), 0\)"), 3, r"\1")], report)
    expect("an unneeded allow-list entry fails; an explained difference and a rewritten one pass", 1, report.failed)
    expect("... naming the entry", True, "line 2: portable ^signature gone matches nothing" in out.getvalue())
    report = Report(io.StringIO())
    compare_editions({"view v SELECT 2 AS x"}, {"view v SELECT NULLIF(1, 0) AS x"},
                     [("portable", re.compile(r"NULLIF\((1), 0\)"), 3, r"\1")], report)
    expect("a rewrite explains only the difference it names", 2, report.failed)
    for f in failures:
        print(f"FAIL {f}")
    print(f"compare.py self-test: {count[0] - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--native")
    parser.add_argument("--portable")
    parser.add_argument("--contract")
    parser.add_argument("--allowed")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    with open(args.native) as f:
        native = compared_lines(f.read())
    with open(args.portable) as f:
        portable = compared_lines(f.read())
    with open(args.contract) as f:
        contract = json.load(f)
    allowed = read_allowed(args.allowed)
    report = Report()
    compare_editions(native, portable, allowed, report)
    compare_with_contract("native", native, contract, allowed, report)
    compare_with_contract("portable", portable, contract, allowed, report)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
