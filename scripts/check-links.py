#!/usr/bin/python3
"""Checks the relative links and #anchors of every git-tracked Markdown file.

    scripts/check-links.py              check the repository; exit 1 on any broken link
    scripts/check-links.py --self-test  prove on a temporary tree that breakage is caught

A link resolves when its path names a tracked file or a folder holding tracked files
(a file that exists but is not tracked would be missing from a clean clone), and when its
#anchor names a heading of the Markdown file it points to, with GitHub's slugs: lower
case, everything but letters, digits, '_', '-' and spaces dropped, spaces turned into
'-', and the second "Foo" becoming "foo-1", the third "foo-2". Anchors into other files
may only be GitHub's line anchors (#L10, #L10-L20). External links (http:, https:,
mailto:, ...) are neither fetched nor counted. Text in code blocks, code spans and HTML
comments is not a link. Ends with "links: N passed, M failed" (N: links checked).
Python 3 standard library only.
"""
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^\s()]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", re.M)
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def blank(text):
    """Spaces instead of every character but newlines, so offsets and line numbers hold."""
    return re.sub(r"[^\n]", " ", text)


def strip_fences(markdown):
    """The text with fenced code blocks blanked out."""
    out, fence = [], None
    for line in markdown.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append(blank(line))
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None
            out.append(blank(line))
        else:
            out.append(line)
    return "\n".join(out)


def strip_code(markdown):
    """The text with fenced code blocks, HTML comments and code spans blanked out."""
    text = strip_fences(markdown)
    text = re.sub(r"<!--.*?-->", lambda m: blank(m.group(0)), text, flags=re.S)
    return re.sub(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", lambda m: blank(m.group(0)), text, flags=re.S)


def heading_text(raw):
    """What GitHub renders of a heading's source: no markup, links as their text."""
    parts = re.split(r"(`+[^`]*?`+)", raw)
    out = []
    for i, part in enumerate(parts):
        if i % 2:                       # a code span: its content, verbatim
            out.append(part.strip("`").strip())
            continue
        part = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part)
        part = re.sub(r"<[^>]+>", "", part)
        part = re.sub(r"(?<!\w)[*_]+|[*_]+(?!\w)", "", part)
        out.append(part)
    return "".join(out).strip()


def slug(text):
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(markdown):
    """Every anchor a Markdown file offers: heading slugs (with -1, -2 for repeats) and HTML ids."""
    lines = strip_fences(markdown).split("\n")
    found, seen = set(), {}

    def add(heading):
        base = slug(heading_text(heading))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")

    for i, line in enumerate(lines):
        m = ATX_HEADING.match(line)
        if m:
            add(m.group(2) or "")
        elif (i > 0 and SETEXT_UNDERLINE.match(line) and lines[i - 1].strip()
              and not ATX_HEADING.match(lines[i - 1]) and not lines[i - 1].lstrip().startswith(("|", ">", "-", "*"))):
            add(lines[i - 1].strip())
    found.update(HTML_ANCHOR.findall(strip_code(markdown)))
    return found


def links(markdown):
    """(line number, target) of every link in a Markdown text, code excluded."""
    text = strip_code(markdown)
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEF, HTML_LINK):
        for m in pattern.finditer(text):
            target = m.group(m.lastindex).strip("<>")
            found.append((text.count("\n", 0, m.start(m.lastindex)) + 1, target))
    return sorted(found)


def check(root, markdown_files, tracked):
    """Checks the links of markdown_files (paths relative to root) against the tracked paths.

    Returns (number of links checked, list of "file:line: target: why" strings)."""
    tracked = set(tracked)
    folders = {os.path.dirname(p) for p in tracked}
    for f in list(folders):
        while f:
            f = os.path.dirname(f)
            folders.add(f)
    cache = {}

    def anchors_of(path):
        if path not in cache:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
                cache[path] = anchors(fh.read())
        return cache[path]

    checked, broken = 0, []
    for source in sorted(markdown_files):
        with open(os.path.join(root, source), encoding="utf-8", errors="replace") as fh:
            content = fh.read()
        for line, target in links(content):
            if SCHEME.match(target) or target.startswith("//"):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            path = urllib.parse.unquote(path.split("?")[0])
            anchor = urllib.parse.unquote(anchor)
            if path:
                base = "" if path.startswith("/") else os.path.dirname(source)
                resolved = os.path.normpath(os.path.join(base, path.lstrip("/")))
            else:
                resolved = source
            why = None
            if resolved.startswith(".."):
                why = "points outside the repository"
            elif resolved in tracked:
                if not os.path.isfile(os.path.join(root, resolved)):
                    why = "file is missing"
                elif anchor and resolved.lower().endswith((".md", ".markdown")):
                    if anchor not in anchors_of(resolved):
                        why = f"no heading with anchor #{anchor} in {resolved}"
                elif anchor and not LINE_ANCHOR.match(anchor):
                    why = f"#{anchor}: only line anchors (#L10) work in {resolved}"
            elif resolved in folders or resolved == ".":
                if anchor:
                    why = f"#{anchor} on a folder"
            elif os.path.exists(os.path.join(root, resolved)):
                why = "exists but is not tracked by git"
            else:
                why = "no such file or folder"
            if why:
                broken.append(f"{source}:{line}: {target}: {why}")
    return checked, broken


def git_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                         capture_output=True).stdout.decode()
    return [p for p in out.split("\0") if p]


def main_check():
    here = os.path.dirname(os.path.abspath(__file__))
    root = subprocess.run(["git", "-C", here, "rev-parse", "--show-toplevel"], check=True,
                          capture_output=True, text=True).stdout.strip()
    tracked = git_files(root)
    markdown = [p for p in tracked if p.lower().endswith((".md", ".markdown"))
                and os.path.isfile(os.path.join(root, p))]
    checked, broken = check(root, markdown, tracked)
    for b in broken:
        print(b)
    print(f"links: {checked - len(broken)} passed, {len(broken)} failed")
    return 1 if broken else 0


SELF_TEST_FILES = {
    "README.md": """# Title

## Two ways to use it
## Two ways to use it
### `idem_claim(scope text, key text)` and **more**
## Against the alternatives (`bench/run.sh`)
## Claim + complete: 1.2x!
Setext heading
--------------

Good: [a](#two-ways-to-use-it) [b](#two-ways-to-use-it-1) [c](#idem_claimscope-text-key-text-and-more)
[d](#against-the-alternatives-benchrunsh) [e](#claim--complete-12x) [f](#setext-heading)
[g](docs/guide.md) [h](docs/guide.md#section-one) [i](docs/) [j](src/lib.rs#L3-L9)
[k](<docs/guide.md>) ![img](docs/pic.png "a picture") [l][ref] <a href="docs/guide.md#section-one">m</a>
[multi
line](docs/guide.md) [n](/docs/guide.md) [ext](https://example.com/nothing#x) [o](#html-id)

[ref]: docs/guide.md#section-one

Broken: [1](#two-ways-to-use-it-2) [2](docs/missing.md) [3](docs/guide.md#no-such-heading)
[4](untracked.md) [5](src/lib.rs#main) [6](../outside.md) [7](#Two-Ways-To-Use-It)

`[not a link](nowhere.md)` <!-- [nor this](nowhere.md) --> and in a block:

```sh
[not a link either](nowhere.md)
# not a heading
```
<a id="html-id"></a>
""",
    "docs/guide.md": """# Guide
## Section one
Back: [x](../README.md#setext-heading) [y](../README.md#not-a-heading) [z](guide.md#guide)
""",
    "docs/pic.png": "",
    "src/lib.rs": "",
    "untracked.md": "",
}
# (file, target) of every link above that must be reported, and how many must pass.
SELF_TEST_BROKEN = {
    ("README.md", "#two-ways-to-use-it-2"), ("README.md", "docs/missing.md"),
    ("README.md", "docs/guide.md#no-such-heading"), ("README.md", "untracked.md"),
    ("README.md", "src/lib.rs#main"), ("README.md", "../outside.md"),
    ("README.md", "#Two-Ways-To-Use-It"), ("docs/guide.md", "../README.md#not-a-heading"),
}
SELF_TEST_PASSING = 19


def self_test():
    passed = failed = 0

    def expect(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            print(f"FAIL: {what}")

    with tempfile.TemporaryDirectory(prefix="check-links-") as root:
        for path, content in SELF_TEST_FILES.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as fh:
                fh.write(content)
        tracked = [p for p in SELF_TEST_FILES if p != "untracked.md"]
        checked, broken = check(root, ["README.md", "docs/guide.md"], tracked)
        reported = {(b.split(":")[0], b.split(": ")[1]) for b in broken}
        for item in sorted(SELF_TEST_BROKEN):
            expect(item in reported, f"{item[0]}: {item[1]} should be reported broken")
        for item in sorted(reported - SELF_TEST_BROKEN):
            expect(False, f"{item[0]}: {item[1]} reported broken, but it resolves or is not a link")
        expect(checked == SELF_TEST_PASSING + len(SELF_TEST_BROKEN),
               f"{checked} links checked, expected {SELF_TEST_PASSING + len(SELF_TEST_BROKEN)}"
               " (external links and code must not count)")
        expect(all(re.match(r"^[\w./-]+:\d+: ", b) for b in broken), "each report names file:line")
        line_of_multi = [b for b in broken if "#two-ways-to-use-it-2" in b]
        expect(line_of_multi and line_of_multi[0].startswith("README.md:20:"),
               f"line numbers count from 1: {line_of_multi}")
    print(f"links-self-test: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if sys.argv[1:]:
        sys.exit(__doc__)
    sys.exit(main_check())
