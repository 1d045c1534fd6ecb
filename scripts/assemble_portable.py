#!/usr/bin/env python3
"""Assembles the portable edition's release file and pgtle.sql from their sources.

    scripts/assemble_portable.py [--version V]           write both files
    scripts/assemble_portable.py [--version V] --check   write nothing; exit 1 with a diff
                                                         when a committed file differs
    scripts/assemble_portable.py [--version V] --print release|pgtle

V defaults to Cargo.toml's version. The sources:
  sql/portable/release.sql.in   the release file, with directives (lines starting "--@")
                                naming what goes where
  sql/portable/functions/*.sql  this edition's own functions, one file per concern
  the shared DDL                the sql/ files src/ builds into the native edition
                                (extension_sql_file!): tables, indexes, type, view, procedure,
                                distribute(); statements are taken from them as they are
  sql/portable/pgtle.sql.in     pgtle.sql around the release file ("--@ release")
Writes sql/portable/idempotency-portable--V.sql and sql/portable/pgtle.sql. A released
file is frozen: once the sources move on, V is the next release (CONTRIBUTING.md).
"""

import argparse
import difflib
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE_TEMPLATE = "sql/portable/release.sql.in"
PGTLE_TEMPLATE = "sql/portable/pgtle.sql.in"
PGTLE = "sql/portable/pgtle.sql"
FUNCTIONS = "sql/portable/functions"
VERSION_MARK = "{{version}}"


class AssemblyError(Exception):
    pass


def release_path(version):
    return f"sql/portable/idempotency-portable--{version}.sql"


def cargo_version(root=ROOT):
    with open(root / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["package"]["version"]


def shared_ddl_files(root=ROOT):
    """The sql/ files the native build reads, as the Rust sources name them."""
    found = set()
    for rs in sorted((root / "src").rglob("*.rs")):
        for m in re.finditer(r'extension_sql_file!\(\s*"((?:\.\./)+sql/[^"]+)"', rs.read_text()):
            found.add((rs.parent / m.group(1)).resolve().relative_to(root.resolve()).as_posix())
    return sorted(found)


class Statement:
    """One statement of a SQL file: its text from its first line through the line that ends
    it (";" at the end of a line, outside $$ quotes), and the comment lines right above it."""

    def __init__(self, comment, text):
        self.comment = comment
        self.text = text
        self.first_line = text.split("\n", 1)[0]


def split_statements(sql):
    statements, lines, comment = [], [], []
    in_dollars = False
    for line in sql.splitlines(keepends=True):
        if not lines:
            if line.startswith("--"):
                comment.append(line)
                continue
            if not line.strip():
                comment = []
                continue
        lines.append(line)
        if line.count("$$") % 2:
            in_dollars = not in_dollars
        if not in_dollars and line.rstrip().endswith(";"):
            statements.append(Statement("".join(comment), "".join(lines)))
            lines, comment = [], []
    if lines:
        raise AssemblyError(f"unterminated statement: {lines[0].rstrip()}")
    return statements


def find_statement(statements, start, where):
    matches = [i for i, s in enumerate(statements) if s.first_line.startswith(start)]
    if len(matches) != 1:
        raise AssemblyError(f"{where}: {len(matches)} statements start with {start!r} (need exactly one)")
    return matches[0]


def assemble(template, version, read, shared, release_text=None):
    """The template with its directives carried out. read(path) gives a file's text; shared:
    the shared DDL files, each of whose statements the template must name exactly once."""
    out = []
    named = {}  # (path, index) -> template line
    statements = {}
    last = None  # index into out of the statement that replace / with edit
    pending = None  # a replace waiting for its with

    def statements_of(path, where):
        if path not in shared:
            raise AssemblyError(f"{where}: {path} is not a shared DDL file ({', '.join(shared)})")
        if path not in statements:
            statements[path] = split_statements(read(path))
        return statements[path]

    def name(path, start, where):
        index = find_statement(statements_of(path, where), start, where)
        if (path, index) in named:
            raise AssemblyError(f"{where}: {path}: {start!r} is already named at {named[path, index]}")
        named[path, index] = where
        return statements[path][index]

    for number, line in enumerate(template.splitlines(keepends=True), 1):
        where = f"line {number}"
        if not line.startswith("--@"):
            if pending is not None:
                raise AssemblyError(f"{where}: 'replace:' without 'with:'")
            out.append(line.replace(VERSION_MARK, version))
            last = None
            continue
        verb, _, arg = line[3:].strip().partition(" ")
        arg = arg.strip()
        if verb == "--" or (verb == "" and not arg):
            continue
        if pending is not None and verb != "with:":
            raise AssemblyError(f"{where}: 'replace:' without 'with:'")
        if verb == "include":
            text = read(arg)
            if VERSION_MARK in text:
                raise AssemblyError(f"{where}: {arg} holds {VERSION_MARK}: only templates may")
            out.append(text)
            last = None
        elif verb in ("statement", "commented-statement", "native-only"):
            path, sep, start = arg.partition(": ")
            if not sep or not start:
                raise AssemblyError(f"{where}: expected '{verb} PATH: START'")
            found = name(path, start, where)
            if verb == "native-only":
                continue
            out.append(found.text if verb == "statement" else found.comment + found.text)
            last = len(out) - 1
        elif verb == "replace:":
            if last is None:
                raise AssemblyError(f"{where}: 'replace:' must follow a statement")
            times = out[last].count(arg)
            if times != 1:
                raise AssemblyError(f"{where}: {arg!r} occurs {times} times in the statement (need once)")
            pending = arg
        elif verb == "with:":
            if pending is None:
                raise AssemblyError(f"{where}: 'with:' without 'replace:'")
            out[last] = out[last].replace(pending, arg)
            pending = None
        elif verb == "release":
            if release_text is None:
                raise AssemblyError(f"{where}: 'release' is for the pgtle.sql template")
            out.append(release_text)
            last = None
        else:
            raise AssemblyError(f"{where}: unknown directive {verb!r}")
    if pending is not None:
        raise AssemblyError("the template ends with a 'replace:' without 'with:'")
    if release_text is None:
        forgotten = [
            f"{path}: {s.first_line}"
            for path in shared
            for i, s in enumerate(statements_of(path, "shared DDL"))
            if (path, i) not in named
        ]
        if forgotten:
            raise AssemblyError(
                "statements of the shared DDL that the template names neither as statement nor as "
                "native-only:\n  " + "\n  ".join(forgotten)
            )
    return "".join(out)


def assemble_all(version, root=ROOT):
    """{path: text} of the files the sources make."""

    read_paths = set()

    def read(path):
        read_paths.add(path)
        return (root / path).read_text()

    shared = shared_ddl_files(root)
    release = assemble(read(RELEASE_TEMPLATE), version, read, shared)
    unused = sorted(p.relative_to(root).as_posix() for p in (root / FUNCTIONS).glob("*.sql"))
    unused = [p for p in unused if p not in read_paths]
    if unused:
        raise AssemblyError(f"{RELEASE_TEMPLATE} includes none of: {', '.join(unused)}")
    pgtle = assemble(read(PGTLE_TEMPLATE), version, read, shared, release_text=release)
    return {release_path(version): release, PGTLE: pgtle}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", help="the release (default: Cargo.toml's version)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    mode.add_argument("--print", choices=["release", "pgtle"], help="print one assembled file")
    args = parser.parse_args()
    version = args.version or cargo_version()
    try:
        files = assemble_all(version)
    except (AssemblyError, OSError) as e:
        print(f"assemble_portable: {e}", file=sys.stderr)
        return 2
    if args.print:
        sys.stdout.write(files[release_path(version) if args.print == "release" else PGTLE])
        return 0
    differ = 0
    for path, text in files.items():
        target = ROOT / path
        if not args.check:
            target.write_text(text)
            print(f"wrote {path}")
            continue
        committed = target.read_text() if target.exists() else ""
        if committed != text:
            differ += 1
            print(f"{path} differs from what the sources assemble (- committed, + assembled):")
            diff = difflib.unified_diff(committed.splitlines(True), text.splitlines(True), path, "assembled")
            sys.stdout.writelines(list(diff)[:60])
    if differ:
        print(
            "Run scripts/assemble_portable.py to write them; a released file is frozen, so a change "
            "to its sources belongs to the next release (CONTRIBUTING.md, Adding a release)."
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
