#!/usr/bin/python3
"""Checks the repository against contract/contract.json, the one description of the contract.

    scripts/check-contract.py              check; exit 1 when anything differs
    scripts/check-contract.py --write      rewrite the generated parts of docs/reference.md
    scripts/check-contract.py --self-test  prove that a changed description is caught
    scripts/check-contract.py --contract FILE   check against another description

What it checks, each a named check:
- the description itself: every outcome's problem exists and has the outcome's status, every
  function a SQLSTATE names exists, no SQLSTATE twice;
- docs/reference.md: each function's heading is its signature as the description gives it;
  the settings, problems and error tables are the ones generated from the description (between the
  `<!-- contract:NAME -->` markers; --write regenerates them and the headings); the
  claim_result columns, the stats view's columns, the outcome table's and the HTTP mapping's
  statuses;
- src/errors.rs's SQLSTATEs, the ones the install SQL raises (sql/*.sql, sql/portable/) and
  every IK code or `SQLSTATE NNNNN` written in a tracked file: all in the description, and
  every code the description says the extension raises is raised somewhere;
- src/settings.rs registers every described setting with its default and range;
- every problem type (`urn:pg-idempotency:...`) written in a tracked file is one the
  description gives.
The client packages check their own maps in their own tests. Ends with
"contract: N passed, M failed". Python 3 standard library only.
"""
import json
import math
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = "docs/reference.md"
SHORT_TYPES = {"integer": "int", "timestamp with time zone": "timestamptz"}
MARKER = re.compile(r"(<!-- contract:(\w+) -->\n)(.*?)(<!-- /contract:\2 -->)", re.DOTALL)
# SQLSTATEs a tracked file may name that are neither the extension's nor met through it.
NOT_RAISED_BY_US = {
    "26000": "PgBouncer's lost prepared statements (clients/python/README.md)",
}
HEADING = re.compile(r"^### ((?:`[^`]+`(?: and )?)+)(.*)$")


class Checks:
    def __init__(self, quiet=False):
        self.passed, self.failed, self.failures, self.quiet = 0, 0, [], quiet

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(name)
        if not self.quiet and not ok:
            print(f"FAIL {name}" + (f": {detail}" if detail else ""))
        elif not self.quiet:
            print(f"ok   {name}")


# --- rendering from the description -------------------------------------------------------

def show_type(t):
    return SHORT_TYPES.get(t, t)


def signature(fn):
    args = ", ".join(f"{a['name']} {show_type(a['type'])}" + (f" DEFAULT {a['default']}" if a["default"] else "")
                     for a in fn["args"])
    if fn["kind"] == "procedure":
        return f"CALL {fn['name']}({args})"
    if fn["returns"] == "TABLE":
        cols = ", ".join(f"{c['name']} {show_type(c['type'])}" for c in fn["columns"])
        returns = f"TABLE({cols})"
    else:
        returns = show_type(fn["returns"])
    return f"{fn['name']}({args}) RETURNS {returns}"


def raisers(names):
    words = {"*": "every function", "SET": "`SET`"}
    return ", ".join(words.get(n, f"`{n}`") for n in names)


def errors_table(contract):
    rows = ["| SQLSTATE | condition | raised by |", "| --- | --- | --- |"]
    for s in contract["sqlstates"]:
        own = " (PostgreSQL's own)" if s["origin"] == "postgres" else ""
        rows.append(f"| `{s['code']}` | {s['meaning']}{own} | {raisers(s['raised_by'])} |")
    return "\n" + "\n".join(rows) + "\n\n"


def settings_table(contract):
    rows = ["| setting | default | range | meaning |", "| --- | --- | --- | --- |"]
    for s in contract["settings"]:
        rows.append(f"| `{s['name']}` | `{s['default']}` | {s['range']} | {s['meaning']} |")
    return "\n" + "\n".join(rows) + "\n\n"


def problems_table(contract):
    rows = ["| `type` | status | title | detail |", "| --- | --- | --- | --- |"]
    for p in contract["problems"]:
        extra = "".join(f" (with `{h}`)" for h in p.get("headers", []))
        problem_type = contract["problem_type_prefix"] + p["slug"]
        rows.append(f"| `{problem_type}` | {p['status']}{extra} | {p['title']} | {p['detail']} |")
    return "\n" + "\n".join(rows) + "\n\n"


GENERATED = {"errors": errors_table, "settings": settings_table, "problems": problems_table}


def headings_by_name(contract):
    """function name -> the heading's code spans, for the functions docs/reference.md describes."""
    spans = {}
    for fn in contract["functions"]:
        if fn.get("doc") == REFERENCE:
            spans.setdefault(fn["name"], []).append(f"`{signature(fn)}`")
    return {name: " and ".join(s) for name, s in spans.items()}


def heading_name(line):
    m = HEADING.match(line)
    if not m:
        return None
    n = re.match(r"`(?:CALL )?(\w+)\(", m.group(1))
    return n.group(1) if n else None


def regenerate(text, contract):
    """docs/reference.md with its headings and generated tables made from the description."""
    wanted = headings_by_name(contract)
    lines = text.split("\n")
    for i, line in enumerate(lines):
        name = heading_name(line)
        if name in wanted:
            lines[i] = f"### {wanted[name]}{HEADING.match(line).group(2)}"
    text = "\n".join(lines)
    return MARKER.sub(lambda m: m.group(1) + GENERATED[m.group(2)](contract) + m.group(4), text)


# --- the checks -----------------------------------------------------------------------------

def check_description(c, contract):
    slugs = {p["slug"]: p for p in contract["problems"]}
    for o in contract["outcomes"]:
        if o["problem"] is None:
            continue
        p = slugs.get(o["problem"])
        c.check(f"description: outcome {o['outcome']}'s problem {o['problem']} is described", p is not None)
        if p:
            c.check(f"description: outcome {o['outcome']}'s status {o['http_status']} is its problem's",
                    p["status"] == o["http_status"], f"problem {p['slug']} has {p['status']}")
    names = {f["name"] for f in contract["functions"]} | {"*", "SET"}
    codes = [s["code"] for s in contract["sqlstates"]]
    c.check("description: no SQLSTATE twice", len(codes) == len(set(codes)), str(codes))
    for s in contract["sqlstates"]:
        unknown = [n for n in s["raised_by"] if n not in names]
        c.check(f"description: SQLSTATE {s['code']} is raised by described functions", not unknown, str(unknown))


def section(text, title):
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    return m.group(1) if m else ""


def table_rows(text):
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|") and not line.startswith("| ---")]


def check_reference(c, contract, text):
    wanted = headings_by_name(contract)
    found = {}
    for line in text.split("\n"):
        name = heading_name(line)
        if name:
            found[name] = HEADING.match(line).group(1)
    for name, spans in wanted.items():
        c.check(f"{REFERENCE}: the heading of {name} is its signature", found.get(name) == spans,
                f"\n  doc:      {found.get(name)}\n  contract: {spans}")
    extra = sorted(set(found) - set(wanted))
    c.check(f"{REFERENCE}: every function heading is a described function", not extra, str(extra))

    blocks = {m.group(2): m.group(3) for m in MARKER.finditer(text)}
    for name, render in GENERATED.items():
        have, want = blocks.get(name), render(contract)
        detail = f"no <!-- contract:{name} --> block" if have is None else "\n" + "\n".join(
            f"  - {a}\n  + {b}"
            for a, b in zip(have.splitlines() + [""] * 99, want.splitlines(), strict=False) if a != b)
        c.check(f"{REFERENCE}: the {name} table is the one generated from the description "
                "(scripts/check-contract.py --write)", have == want, detail)

    cols = ", ".join(f"{x['name']} {show_type(x['type'])}" for x in contract["types"]["idempotency.claim_result"])
    c.check(f"{REFERENCE}: claim_result's columns", f"`claim_result` columns: `{cols}`" in " ".join(text.split()),
            f"expected `{cols}`")
    stats = section(text, "`idempotency.stats`")
    named = [x["name"] for x in contract["views"]["idempotency.stats"] if f"`{x['name']}`" not in stats]
    c.check(f"{REFERENCE}: the stats section names every column of the view", not named, f"missing {named}")

    statuses = {o["outcome"]: o["http_status"] for o in contract["outcomes"]}
    outcome_rows = {r[0].strip("`"): r for r in table_rows(section(text, "Functions")) if len(r) >= 4}
    mapping_rows = table_rows(section(text, "HTTP mapping"))
    for outcome, status in statuses.items():
        row = outcome_rows.get(outcome)
        want = "NULL" if status is None else ("stored status" if status == "stored" else str(status))
        c.check(f"{REFERENCE}: the outcome table gives {outcome} http_status {want}",
                row is not None and row[3] == want, str(row))
        if isinstance(status, int):
            hits = [r for r in mapping_rows if f"`{outcome}`" in r[0]]
            c.check(f"{REFERENCE}: the HTTP mapping answers {outcome} with {status}",
                    bool(hits) and all(re.match(rf"{status}\b", r[1]) for r in hits), str(hits))
    for slug, words in (("idempotency-key-missing", "missing"), ("idempotency-key-invalid", "malformed")):
        status = next((p["status"] for p in contract["problems"] if p["slug"] == slug), None)
        hits = [r for r in mapping_rows if words in r[0]]
        c.check(f"{REFERENCE}: the HTTP mapping answers a {words} key with {status}",
                bool(hits) and all(re.match(rf"{status}\b", r[1]) for r in hits), str(hits))


def tracked_files():
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout
    for path in out.decode().split("\0"):
        full = os.path.join(ROOT, path)
        # sql/releases/: the frozen native install script, the build's copy of the sources read
        # here (past releases' are in git history, not in the tree).
        if path and os.path.isfile(full) and not path.startswith("sql/releases/"):
            try:
                with open(full, encoding="utf-8") as f:
                    yield path, f.read()
            except UnicodeDecodeError:
                continue


def check_codes(c, contract, files):
    described = {s["code"] for s in contract["sqlstates"]}
    own = {s["code"] for s in contract["sqlstates"] if s["origin"] == "extension"}
    errors_rs = files.get("src/errors.rs", "")
    rust = set(re.findall(r'=> "([0-9A-Z]{5})"', errors_rs))
    c.check("src/errors.rs: found its SQLSTATEs", bool(rust))
    c.check("src/errors.rs: every SQLSTATE it raises is described", rust <= described, str(sorted(rust - described)))
    sql = {}
    for path, text in files.items():
        if path.startswith("sql/") and path.endswith(".sql"):
            for code in re.findall(r"ERRCODE\s*=\s*'([0-9A-Z]{5})'", text):
                sql.setdefault(code, path)
    unknown = {code: path for code, path in sql.items() if code not in described}
    c.check("sql/: every ERRCODE the install scripts raise is described", not unknown, str(unknown))
    unraised = sorted(own - rust - set(sql))
    c.check("every SQLSTATE the description calls the extension's own is raised (src/errors.rs, sql/)",
            not unraised, str(unraised))
    stated = {}
    for path, text in files.items():
        if path in ("contract/contract.json", "scripts/check-contract.py"):
            continue
        for code in re.findall(r"\bIK\d{3}\b", text) + re.findall(r"SQLSTATE\s+`?([0-9][0-9A-Z]{4})\b", text):
            if code not in described and code not in NOT_RAISED_BY_US:
                stated.setdefault(code, path)
    c.check("no tracked file names an IK code or `SQLSTATE NNNNN` the description lacks", not stated, str(stated))


def product(expr):
    """'1024 * 1024' -> 1048576: the bounds as settings.rs writes them."""
    return math.prod(int(x) for x in expr.split("*"))


def check_settings(c, contract, files):
    """src/settings.rs registers every described setting, with the described default and range."""
    rs = files.get("src/settings.rs", "")
    strings = dict(re.findall(r'c"(idempotency\.\w+)"\.as_ptr\(\),.*?addr_of_mut!\(\w+\),\s*c"([^"]*)"', rs, re.DOTALL))
    ints = {m[0]: m[1:] for m in re.findall(
        r'define_int_guc\(\s*c"(idempotency\.\w+)",.*?&(\w+),\s*([\d *]+),\s*([\d *]+),', rs, re.DOTALL)}
    registered = set(re.findall(r'c"(idempotency\.\w+)"', rs))
    c.check("src/settings.rs: registers only described settings",
            registered <= {s["name"] for s in contract["settings"]}, str(sorted(registered)))
    for s in contract["settings"]:
        if s["type"] == "integer":
            static, low, high = ints.get(s["name"], (None, "0", "0"))
            default = re.search(rf"{static}: GucSetting<i32> = GucSetting::<i32>::new\((\d+)\)", rs) if static else None
            if default and s.get("unit") == "kB":
                shown = (f"{int(default.group(1)) // 1024}MB" if int(default.group(1)) % 1024 == 0
                         else f"{default.group(1)}kB")
            else:
                shown = default and default.group(1)
            ok = shown == s["default"] and product(low) == s["min"] and product(high) == s["max"]
            unit = s.get("unit", "")
            what = f"src/settings.rs: {s['name']} defaults to {s['default']}, {s['min']} to {s['max']} {unit}"
            c.check(what.rstrip(), ok, f"default {shown}, range {low} to {high}")
        elif s["type"] == "real":
            static = re.search(rf'define_float_guc\(\s*c"{re.escape(s["name"])}",.*?&(\w+),', rs, re.DOTALL)
            default = static and re.search(
                rf"{static.group(1)}: GucSetting<f64> = GucSetting::<f64>::new\(([\d.]+)\)", rs)
            c.check(f"src/settings.rs: {s['name']} defaults to {s['default']}",
                    bool(default) and default.group(1) == s["default"], str(default and default.group(1)))
        elif s["type"] == "boolean":
            static = re.search(rf'define_bool_guc\(\s*c"{re.escape(s["name"])}",.*?&(\w+),', rs, re.DOTALL)
            default = static and re.search(
                rf"{static.group(1)}: GucSetting<bool> = GucSetting::<bool>::new\((true|false)\)", rs)
            shown = default and {"true": "on", "false": "off"}[default.group(1)]
            c.check(f"src/settings.rs: {s['name']} defaults to {s['default']}", shown == s["default"], str(shown))
        else:
            c.check(f"src/settings.rs: {s['name']} defaults to {s['default']}", strings.get(s["name"]) == s["default"],
                    str(strings.get(s["name"])))


def check_problem_types(c, contract, files):
    prefix = contract["problem_type_prefix"]
    known = {prefix + p["slug"] for p in contract["problems"]}
    stated = {}
    for path, text in files.items():
        if path in ("contract/contract.json", "scripts/check-contract.py"):
            continue
        for t in re.findall(r"urn:pg-idempotency:[A-Za-z0-9:._-]*", text):
            if t != prefix and t not in known:
                stated.setdefault(t, path)
    c.check("no tracked file states a problem type the description lacks", not stated, str(stated))


def run(contract, reference_text, files, quiet=False):
    c = Checks(quiet)
    check_description(c, contract)
    check_reference(c, contract, reference_text)
    check_codes(c, contract, files)
    check_settings(c, contract, files)
    check_problem_types(c, contract, files)
    return c


def self_test():
    """A description changed in the ways the issue names must make named checks fail."""
    with open(os.path.join(ROOT, "contract/contract.json")) as f:
        base = json.load(f)
    with open(os.path.join(ROOT, REFERENCE)) as f:
        reference = f.read()
    files = dict(tracked_files())
    c = Checks()
    clean = run(base, reference, files, quiet=True)
    c.check("self-test: the repository passes as it is", clean.failed == 0, str(clean.failures))

    def mutated(change):
        m = json.loads(json.dumps(base))
        change(m)
        return run(m, reference, files, quiet=True).failures

    def status(m):
        next(o for o in m["outcomes"] if o["outcome"] == "mismatch")["http_status"] = 400
    f = mutated(status)
    c.check("self-test: mismatch's status changed to 400 fails the outcome table and the HTTP mapping",
            any("outcome table gives mismatch" in x for x in f)
            and any("HTTP mapping answers mismatch" in x for x in f),
            str(f))

    def title(m):
        m["problems"][0]["title"] = "Key missing"
    f = mutated(title)
    c.check("self-test: a problem's title changed fails the problems table",
            any("problems table" in x for x in f), str(f))

    def prefix(m):
        m["problem_type_prefix"] = "urn:pg-idempotency:error:"
    f = mutated(prefix)
    c.check("self-test: another problem type prefix fails the problem types written in the repository",
            any("problem type the description lacks" in x for x in f), str(f))

    def default(m):
        next(x for x in m["functions"] if x["name"] == "idem_sweep")["args"][0]["default"] = "5000"
    f = mutated(default)
    c.check("self-test: a changed default fails idem_sweep's heading",
            any("heading of idem_sweep" in x for x in f), str(f))

    def code(m):
        m["sqlstates"] = [s for s in m["sqlstates"] if s["code"] != "IK002"]
    f = mutated(code)
    c.check("self-test: a dropped SQLSTATE fails errors.rs, the error table and the files naming it",
            any("src/errors.rs: every SQLSTATE" in x for x in f) and any("errors table" in x for x in f)
            and any("IK code" in x for x in f), str(f))

    def setting(m):
        m["settings"][0]["default"] = "12h"
    f = mutated(setting)
    c.check("self-test: a changed setting default fails the settings table and src/settings.rs",
            any("settings table" in x for x in f) and any("src/settings.rs: idempotency.default_ttl" in x for x in f),
            str(f))
    return c


def main(argv):
    contract_path = os.path.join(ROOT, "contract/contract.json")
    if "--contract" in argv:
        contract_path = argv[argv.index("--contract") + 1]
    if "--self-test" in argv:
        c = self_test()
        print(f"contract-self-test: {c.passed} passed, {c.failed} failed")
        return 1 if c.failed else 0
    with open(contract_path) as f:
        contract = json.load(f)
    ref_path = os.path.join(ROOT, REFERENCE)
    with open(ref_path) as f:
        reference = f.read()
    if "--write" in argv:
        new = regenerate(reference, contract)
        if new != reference:
            with open(ref_path, "w") as f:
                f.write(new)
            print(f"wrote {REFERENCE}")
        reference = new
    c = run(contract, reference, dict(tracked_files()))
    print(f"contract: {c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
