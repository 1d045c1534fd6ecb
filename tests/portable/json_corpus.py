#!/usr/bin/env python3
"""Random JSON documents for comparing the two editions' idem_fingerprint.

    json_corpus.py COUNT SEED  > corpus.csv

One CSV row per document: the JSON text, then the `ignore` array as a PostgreSQL array
literal (empty when none). The documents stress what RFC 8785 is picky about: key order
by UTF-16 code units (characters above U+FFFF next to U+E000-U+FFFF), escapes and control
characters, and numbers of every shape (long integers, many digits, exponents near the
limits of a double, subnormals, ties, numbers beyond the double range).
"""
import csv
import json
import random
import struct
import sys

KEY_CHARS = ["a", "b", "B", "1", "_", " ", "é", "ö", "€", "\u0080", "\u2028", "\ufb33",
             "\ue000", "\uffff", "\U00010000", "\U0001f600", "\U0010ffff", "\r", "\u0001",
             "\u001f", "\"", "\\", "/", "\u007f", "日", "\ud7ff"]
STRING_CHARS = KEY_CHARS + ["\n", "\t", "\b", "\f", "x", "'", "\u00ad", "\u200b"]
EDGE_NUMBERS = ["0", "-0", "0.0", "-0.0", "1e21", "1e20", "1e-7", "1e-6", "0.000001",
                "-1.5e-7", "5e-324", "-5e-324", "1.7976931348623157e308", "0.1",
                "123456789012345680000", "123456789012345678901234", "9007199254740993",
                "1424953923781206.25", "1059438285926254.25", "26363981746409.3125",
                "7.120236347223045e-307", "333333333.33333329", "1E30", "4.50", "2e-3",
                "0.000000000000000000000000001", "2.4703282292062328e-324",
                "2.4703282292062327e-324", "1e-400", "999999999999999", "1000000000000000",
                "1.0000000000000001e23", "9.999999999999997e22", "295147905179352830000",
                "1e400", "-1e309", "1.7976931348623159e308", "1.79769313486231580793e308"]


def rand_number(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(EDGE_NUMBERS)
    if kind == 1:
        return str(rng.randrange(-10**6, 10**6))
    if kind == 2:
        return str(rng.randrange(-10**30, 10**30))
    if kind == 3:  # a random double, as Python prints it (shortest round-trip)
        while True:
            x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if x == x and abs(x) != float("inf"):
                return repr(x).replace("inf", "1")
    if kind == 4:  # many digits, a fraction and an exponent
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 40)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randrange(0, 25)))
        text = digits.lstrip("0") or "0"
        if frac:
            text += "." + frac
        if rng.random() < 0.6:
            text += rng.choice(["e", "E"]) + rng.choice(["", "+", "-"]) + str(rng.randrange(0, 330))
        return ("-" if rng.random() < 0.3 else "") + text
    if kind == 5:  # short decimals
        return f"{rng.uniform(-1000, 1000):.{rng.randrange(0, 8)}f}"
    if kind == 6:  # powers of ten around the exponent-form borders
        return f"{rng.choice(['1', '1.5', '9.99', '12345'])}e{rng.randrange(-30, 30)}"
    return str(rng.randrange(2**52, 2**54))


def rand_string(rng, chars, longest):
    return "".join(rng.choice(chars) for _ in range(rng.randrange(0, longest)))


def rand_value(rng, depth):
    kind = rng.randrange(10 if depth < 5 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind in (2, 3):
        return ("num", rand_number(rng))
    if kind in (4, 5):
        return rand_string(rng, STRING_CHARS, 12)
    if kind in (6, 7):
        return [rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {rand_string(rng, KEY_CHARS, 4): rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 7))}


def dump(value):
    """JSON text with numbers exactly as generated (json.dumps would reformat them)."""
    if isinstance(value, tuple):
        return value[1]
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dump(v) for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def main():
    count, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    out = csv.writer(sys.stdout, lineterminator="\n")
    for _ in range(count):
        doc = rand_value(rng, 0) if rng.random() < 0.2 else {
            rand_string(rng, KEY_CHARS, 4): rand_value(rng, 1) for _ in range(rng.randrange(0, 8))}
        ignore = ""
        if isinstance(doc, dict) and doc and rng.random() < 0.3:
            names = rng.sample(sorted(doc), rng.randrange(1, len(doc) + 1)) + ["absent"]
            ignore = "{" + ",".join('"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in names) + "}"
        out.writerow([dump(doc), ignore])


if __name__ == "__main__":
    main()
