#!/usr/bin/python3
"""No two modules of a Rust crate import each other, directly or around a longer loop.

For each crate below, every file is a module (src/api/claim.rs is api::claim, src/api/mod.rs
is api). A module depends on another when it names it in a path: `crate::a::b`,
`crate::{a, b}`, `super::x`, `self::x`, outside comments. A parent declaring or re-exporting its
own children is not a dependency, and test modules (`#[cfg(test)] mod tests { ... }`) are
left out: the rule is about the code that ships.

  scripts/check-module-cycles.py             the self-test, then every crate (what CI runs)
  scripts/check-module-cycles.py --self-test the checker on a made-up crate only

Last line: "module-cycles: N passed, M failed" (the self-test's checks, then one per crate).
"""

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["src", "clients/rust/src", "examples/charges-api/src"]

TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{")
COMMENT = re.compile(r"//.*$", re.M)
PATH = re.compile(r"\b(crate|super|self)::((?:\{[^}]*\}|[\w:])+)")


def module_of(src, path):
    """src/api/claim.rs -> ("api", "claim"); src/api/mod.rs -> ("api",); src/lib.rs -> ()."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def without_test_modules(text):
    """The text with every `#[cfg(test)] mod NAME { ... }` block removed."""
    while match := TEST_MODULE.search(text):
        depth, at = 1, match.end()
        while depth and at < len(text):
            depth += {"{": 1, "}": -1}.get(text[at], 0)
            at += 1
        text = text[: match.start()] + text[at:]
    return text


def expand(tail):
    """'a::{b, c::d}' -> [['a', 'b'], ['a', 'c', 'd']]: every path a `use` tree names."""
    tail = tail.strip()
    if "{" not in tail:
        return [[p for p in tail.split("::") if p]]
    head, _, inner = tail.partition("{")
    prefix = [p for p in head.split("::") if p]
    inner = inner.rsplit("}", 1)[0]
    items, depth, item = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        item += ch
    items.append(item)
    return [prefix + rest for it in items if it.strip() for rest in expand(it)]


def dependencies(src):
    """{module: set of modules it names}, for the crate whose root directory is `src`."""
    files = {module_of(src, p): p for p in sorted(src.rglob("*.rs"))}
    deps = {}
    for module, path in files.items():
        found = set()
        code = COMMENT.sub("", without_test_modules(path.read_text()))
        for anchor, tail in PATH.findall(code):
            base = {"crate": (), "self": module, "super": module[:-1]}[anchor]
            for names in expand(tail):
                names = [n for n in names if n not in ("self", "*")]
                # The longest module that the path names.
                named = (base + tuple(names[:i]) for i in range(len(names) + 1))
                target = max((m for m in named if m in files), key=len, default=None)
                if target is None or target == module:
                    continue
                if target[: len(module)] == module:
                    continue  # a parent naming its own child
                found.add(target)
        deps[module] = found
    return deps


def cycle(deps):
    """One loop of modules that depend on each other, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(deps.get(node, ())):
            if state.get(nxt) == "open":
                return trail[trail.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, trail + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(deps):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def name(module):
    return "::".join(module) or "crate"


def check(root):
    passed = failed = 0
    for crate in CRATES:
        src = root / crate
        if not src.is_dir():
            print(f"skip {crate}: not in this tree")
            continue
        loop = cycle(dependencies(src))
        if loop:
            failed += 1
            print(f"FAIL {crate}: modules import each other: {' -> '.join(map(name, loop))}")
        else:
            passed += 1
            print(f"ok   {crate}: no two modules import each other")
    return passed, failed


def self_test():
    """The checker on a made-up crate: a loop found, then none once it is broken."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        (src / "api").mkdir(parents=True)
        (src / "lib.rs").write_text("mod api;\nmod errors;\npub use api::claim::claim;\n")
        (src / "errors.rs").write_text("pub struct E;\n")
        (src / "api" / "mod.rs").write_text("mod claim;\nmod wait;\nuse self::claim::Answer;\n")
        (src / "api" / "claim.rs").write_text("use crate::api::wait;\nuse crate::{api::wait::x, errors};\n")
        (src / "api" / "wait.rs").write_text(
            "use super::claim::{Answer, Request};\n#[cfg(test)]\nmod tests { use crate::api::claim::T; }\n"
        )
        results = []
        deps = dependencies(src)
        loop = [("api", "claim"), ("api", "wait"), ("api", "claim")]
        results.append(("claim.rs -> wait.rs -> claim.rs is a loop", cycle(deps) == loop))
        results.append(("a parent naming its child is no dependency", deps[("api",)] == set()))
        (src / "api" / "wait.rs").write_text(
            "use crate::errors::E;\n#[cfg(test)]\nmod tests { use crate::api::claim::T; }\n"
        )
        no_loop = cycle(dependencies(src)) is None
        results.append(("no loop once wait.rs names only errors (tests left out)", no_loop))
    failed = 0
    for what, ok in results:
        print(("ok   " if ok else "FAIL ") + what)
        failed += not ok
    return len(results) - failed, failed


def main(argv):
    if argv not in ([], ["--self-test"]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    passed, failed = self_test()
    if not argv:
        more = check(ROOT)
        passed, failed = passed + more[0], failed + more[1]
    print(f"module-cycles: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
