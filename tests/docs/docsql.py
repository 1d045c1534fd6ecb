"""Pure rules of the docs-sql suite: the SQL blocks of a Markdown file, their statements, the
output each statement shows, and whether what psql printed matches it. No I/O here.

The convention the Markdown follows (CONTRIBUTING.md, "Documentation"):

- every fenced block tagged ``sql`` runs, in the order of the file, in one psql session of a
  fresh database;
- a statement ends with ``;`` at the end of a line (a trailing ``-- comment`` aside), or with
  a psql meta-command on its line (``\\gset``); a line starting with ``\\`` is a statement;
- the comment lines directly under a statement (no blank line between) are its expected
  output, as psql prints it with its default aligned format: the header and its ``---+---``
  line may be left out, and the ``(N rows)`` footer is never shown. An error is shown as
  ``ERROR:  SQLSTATE: message``. A statement without such lines must only run without error;
  prose comments go above a statement, or after a blank line;
- in the expected output ``...`` stands for any text, and every UUID and timestamp matches
  any UUID or timestamp (tokens and times differ on every run).
"""
import re

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*(\S*)")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?|Z)?")
SEPARATOR = re.compile(r"^-+(\+-+)*$")


class Block:
    def __init__(self, line, text):
        self.line = line  # 1-based line of the block's first SQL line
        self.text = text


class Statement:
    def __init__(self, line, sql, expected, meta_only):
        self.line = line          # 1-based line in the Markdown file
        self.sql = sql            # the statement as written (trailing comments included)
        self.expected = expected  # the comment lines under it, '--' removed; [] when none
        self.meta_only = meta_only  # a psql meta-command alone (\set, \echo ...): no SQLSTATE

    def title(self):
        first = self.sql.strip().splitlines()[0]
        return first if len(first) <= 70 else first[:67] + "..."


def sql_blocks(markdown):
    """The fenced blocks tagged sql, in order."""
    blocks, fence, lines, start = [], None, [], 0
    for number, line in enumerate(markdown.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = (m.group(1), m.group(2).lower())
                lines, start = [], number + 1
        elif m and line.strip() == m.group(1) and m.group(1)[0] == fence[0][0] \
                and len(m.group(1)) >= len(fence[0]):
            if fence[1] == "sql":
                blocks.append(Block(start, "\n".join(lines)))
            fence = None
        else:
            lines.append(line)
    return blocks


def scan_line(line, state):
    """(code part of the line, whether a meta-command ends it, the state after it).
    state: None (plain SQL), "'" or '"' (inside a quoted string or name), or "$tag$"."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if state is None:
            if c == "-" and line.startswith("--", i):
                return line[:i], False, None
            if c == "\\":
                return line[:i], True, None
            if c in "'\"":
                state = c
            elif c == "$":
                m = re.match(r"\$[A-Za-z_]*\$", line[i:])
                if m:
                    state = m.group(0)
                    i += len(state)
                    continue
        elif state in "'\"":
            if c == state:
                if line.startswith(state * 2, i):
                    i += 1
                else:
                    state = None
        elif line.startswith(state, i):
            i += len(state)
            state = None
            continue
        i += 1
    return line, False, state


def statements(block):
    """The statements of a block with the expected output under each."""
    result, current, first, state = [], [], 0, None
    lines = block.text.split("\n")
    i = 0
    while i < len(lines):
        line, number = lines[i], block.line + i
        i += 1
        stripped = line.strip()
        if not current and state is None and (not stripped or stripped.startswith("--")):
            continue  # prose between statements
        if not current:
            first = number
        current.append(line)
        code, meta, state = scan_line(line, state)
        if state is None and (meta or code.rstrip().endswith(";")):
            expected = []
            while i < len(lines) and lines[i].strip().startswith("--"):
                expected.append(lines[i].strip()[2:])
                i += 1
            meta_only = len(current) == 1 and stripped.startswith("\\")
            result.append(Statement(first, "\n".join(current), expected, meta_only))
            current = []
    if current:
        result.append(Statement(first, "\n".join(current), [], False))
    return result


def normalize(line):
    """A line of output with UUIDs and timestamps made placeholders, cells trimmed."""
    line = UUID.sub("<uuid>", line)
    line = TIMESTAMP.sub("<timestamp>", line)
    return " | ".join(cell.strip() for cell in line.split("|")).strip()


def matches(expected, actual):
    """Whether the actual lines show what the expected lines show (both as printed, without
    the comment marker)."""
    actual = [a for a in actual if a.strip() != ""]
    expected = [e for e in expected if e.strip() != ""]
    shows_header = any(SEPARATOR.match(e.strip()) for e in expected)
    if not shows_header and len(actual) >= 2 and SEPARATOR.match(actual[1].strip()):
        actual = actual[2:]
    expected = [e for e in expected if not SEPARATOR.match(e.strip())]
    actual = [a for a in actual if not SEPARATOR.match(a.strip())]
    if len(expected) != len(actual):
        return False
    for e, a in zip(expected, actual, strict=True):
        pattern = ".*".join(re.escape(part) for part in normalize(e).split("..."))
        if not re.fullmatch(pattern, normalize(a)):
            return False
    return True
