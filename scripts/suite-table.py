#!/usr/bin/python3
"""CONTRIBUTING.md's table of test suites, written from scripts/test.sh's own list.

scripts/test.sh registers every suite once (register_suites: name, where it runs, tier,
needs, a one-line description, command) and prints that list with --list. This script
renders it as the Markdown table between the two marker lines in CONTRIBUTING.md.

  scripts/suite-table.py --check   the committed table is the rendered one (what CI runs)
  scripts/suite-table.py --write   rewrite the table in CONTRIBUTING.md

Last line of --check: "suite-table: N passed, M failed".
"""

import difflib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "CONTRIBUTING.md"
BEGIN = "<!-- suite table: written by scripts/suite-table.py from scripts/test.sh --list; do not edit -->"
END = "<!-- end of suite table -->"

WHERE = {
    "once": "once",
    "each": "every major",
    "after": "once, after every major",
}


def suites():
    """The suites as scripts/test.sh --list gives them: a list of dicts."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/test.sh"), "--list"], check=True, capture_output=True, text=True
    ).stdout
    fields = ("name", "where", "tier", "needs", "command", "description")
    rows = [dict(zip(fields, line.split("\t"), strict=False)) for line in out.splitlines() if line]
    for row in rows:
        if len(row) != len(fields):
            raise SystemExit(f"suite-table: a line of scripts/test.sh --list lacks fields: {row}")
    return rows


def run_alone(suite):
    """How to run the suite by itself: its script, or scripts/test.sh for a function there."""
    command = suite["command"].removeprefix("OPTIONAL:")
    if "/" in command.split()[0]:
        return f"`{command}`"
    return f"`scripts/test.sh {suite['name']}`"


def runs(suite):
    where = WHERE.get(suite["where"], f"{suite['where']} only")
    return f"{where}, fast tier" if suite["tier"] == "fast" else where


def table():
    lines = ["| suite | runs | what | run alone |", "| --- | --- | --- | --- |"]
    for s in suites():
        lines.append(f"| {s['name']} | {runs(s)} | {s['description']} | {run_alone(s)} |")
    return lines


def split_doc(text):
    """CONTRIBUTING.md as (before the table, the table, after it), markers included outside."""
    lines = text.split("\n")
    try:
        begin, end = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise SystemExit(f"suite-table: {DOC.name} lacks the marker lines {BEGIN!r} and {END!r}") from None
    return lines[: begin + 1], lines[begin + 1 : end], lines[end:]


def main(argv):
    if argv not in (["--check"], ["--write"]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    before, committed, after = split_doc(DOC.read_text())
    rendered = table()
    if argv == ["--write"]:
        DOC.write_text("\n".join(before + rendered + after))
        print(f"suite-table: wrote {len(rendered) - 2} suites into {DOC.name}")
        return 0
    if committed == rendered:
        print(f"ok   {DOC.name}'s suite table lists the {len(rendered) - 2} suites of scripts/test.sh")
        print("suite-table: 1 passed, 0 failed")
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        [line + "\n" for line in committed], [line + "\n" for line in rendered],
        f"{DOC.name} (committed)", "scripts/test.sh --list (rendered)",
    ))
    print(f"FAIL {DOC.name}'s suite table differs from scripts/test.sh: run scripts/suite-table.py --write")
    print("suite-table: 0 passed, 1 failed")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
