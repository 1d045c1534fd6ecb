#!/usr/bin/python3
"""The docs-sql suite: every SQL block of the documentation runs as written and prints what
the page shows (the convention: tests/docs/docsql.py).

    tests/docs/run.py [FILE.md ...]   default: README.md docs/reference.md

Needs a running server with the extension installed, in PGHOST / PGPORT / PGUSER (the
shared test cluster of scripts/test.sh: `scripts/test.sh docs-sql`). Each file gets a fresh
database, docs_sql, and one psql session (psql from PATH: the major under test), in which
its blocks run in order. First the unit tests of docsql.py run. One check per statement;
ends with "docs-sql: N passed, M failed". Python 3 standard library only.
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import docsql  # noqa: E402

FILES = ["README.md", "docs/reference.md"]
DATABASE = "docs_sql"
MARK = "@@docs-sql"


def psql(args, stdin=None, database="postgres"):
    return subprocess.run(["psql", "-X", "-d", database] + args, input=stdin, text=True,
                          capture_output=True, timeout=300)


def script_for(stmts):
    """One psql script: each statement between markers that carry its SQLSTATE."""
    out = ["\\set ON_ERROR_STOP 0", "\\set SHOW_CONTEXT never", "\\pset footer off"]
    for i, s in enumerate(stmts):
        out.append(f"\\echo {MARK}-begin {i}")
        out.append(s.sql)
        out.append(f"\\echo {MARK}-end {i} :SQLSTATE :LAST_ERROR_MESSAGE")
    return "\n".join(out) + "\n"


def outputs(stdout, count):
    """Per statement: (its output lines, SQLSTATE, error message); None when never reached."""
    result, lines, current = [None] * count, [], None
    for line in stdout.split("\n"):
        if line.startswith(f"{MARK}-begin "):
            current, lines = int(line.split()[1]), []
        elif line.startswith(f"{MARK}-end ") and current is not None:
            parts = line.split(" ", 3)
            result[current] = (lines, parts[2], parts[3] if len(parts) > 3 else "")
            current = None
        elif current is not None:
            lines.append(line)
    return result


def run_file(path, counts):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        stmts = [s for b in docsql.sql_blocks(f.read()) for s in docsql.statements(b)]
    if not stmts:
        fail(counts, f"{path}: has SQL blocks", "none found")
        return
    r = psql(["-q", "-c", f"DROP DATABASE IF EXISTS {DATABASE}", "-c", f"CREATE DATABASE {DATABASE}"])
    if r.returncode != 0:
        fail(counts, f"{path}: a fresh database", r.stderr.strip())
        return
    r = psql(["-q"], stdin=script_for(stmts), database=DATABASE)
    results = outputs(r.stdout, len(stmts))
    last_state = "00000"
    for s, res in zip(stmts, results, strict=True):
        name = f"{path}:{s.line} {s.title()}"
        if res is None:
            fail(counts, name, "never ran (psql stopped before it)")
            continue
        lines, state, message = res
        if s.meta_only:
            state = last_state  # psql's SQLSTATE is the last query's, not this command's
        last_state = state
        shown = list(lines)
        if state != "00000":
            shown.append(f"ERROR:  {state}: {message}")
        if s.expected:
            if docsql.matches(s.expected, shown):
                ok(counts, name)
            else:
                fail(counts, name, "the page shows:\n    " + "\n    ".join(s.expected)
                     + "\n  psql printed:\n    " + "\n    ".join(shown))
        elif state != "00000" and not s.meta_only:
            fail(counts, name, f"failed with {state}: {message}")
        else:
            ok(counts, name)
    if r.stderr.strip():
        print(f"  (psql's messages for {path}:)")
        for line in r.stderr.strip().split("\n")[:40]:
            print("    " + line)
    psql(["-q", "-c", f"DROP DATABASE IF EXISTS {DATABASE}"])


def ok(counts, name):
    counts[0] += 1
    print(f"ok   {name}")


def fail(counts, name, why):
    counts[1] += 1
    print(f"FAIL {name}: {why}")


def unit_tests(counts):
    suite = unittest.defaultTestLoader.discover(HERE, pattern="test_docsql.py")
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=1).run(suite)
    bad = len(result.failures) + len(result.errors)
    counts[0] += result.testsRun - bad
    counts[1] += bad


def main():
    files = sys.argv[1:] or FILES
    counts = [0, 0]
    unit_tests(counts)
    for path in files:
        print(f"== {path}")
        run_file(path, counts)
    print(f"docs-sql: {counts[0]} passed, {counts[1]} failed")
    return 1 if counts[1] else 0


if __name__ == "__main__":
    sys.exit(main())
