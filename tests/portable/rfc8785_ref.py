#!/usr/bin/env python3
"""An independent RFC 8785 fingerprint, to check idem_fingerprint against.

    rfc8785_ref.py < corpus.csv > expected.csv

Reads json_corpus.py's rows (JSON text, ignore array literal) and writes one row per
document: its number and 'sha256:<hex>' of the canonical JSON, or 'ERROR' when a number is
beyond the double range. Numbers are read exactly (Decimal), rounded to the nearest double,
and printed as ECMAScript prints numbers, from Python's shortest round-trip repr.
"""
import csv
import decimal
import hashlib
import json
import sys


class OutOfRange(Exception):
    pass


def ecma_decimal(negative, digits, n):
    k = len(digits)
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        body = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if n > 0 else "-") + str(abs(n - 1))
    return "-" + body if negative else body


def number(value):
    x = float(value)
    if x in (float("inf"), float("-inf")):
        raise OutOfRange(str(value))
    if x == 0:
        return "0"
    text = repr(abs(x))
    mantissa, _, exponent = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    if frac == "0":
        frac = ""
    digits = (whole + frac).lstrip("0")
    n = len(whole.lstrip("0")) if whole.lstrip("0") else -(len(frac) - len(frac.lstrip("0")))
    n += int(exponent or 0)
    return ecma_decimal(x < 0, digits.rstrip("0"), n)


def canonical(value):
    if isinstance(value, dict):
        members = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(v) for k, v in members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, decimal.Decimal):
        return number(value)
    return json.dumps(value, ensure_ascii=False)


def parse_ignore(literal):
    if not literal:
        return []
    names, current, quoted, escaped = [], "", False, False
    for ch in literal[1:-1]:
        if escaped:
            current, escaped = current + ch, False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            names.append(current)
            current = ""
        else:
            current += ch
    return names + [current]


def main():
    decimal.getcontext().prec = 2000
    out = csv.writer(sys.stdout, lineterminator="\n")
    for n, (doc, ignore) in enumerate(csv.reader(sys.stdin), start=1):
        value = json.loads(doc, parse_float=decimal.Decimal, parse_int=decimal.Decimal)
        if isinstance(value, dict):
            for name in parse_ignore(ignore):
                value.pop(name, None)
        try:
            text = canonical(value)
        except OutOfRange:
            out.writerow([n, "ERROR"])
            continue
        out.writerow([n, "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()])


if __name__ == "__main__":
    main()
