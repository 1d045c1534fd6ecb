"""The client-side fingerprint (rfc8785 library) equals the extension's idem_fingerprint."""

from __future__ import annotations

import json
import random

import pytest

from pg_idempotency import Idempotency, fingerprint_body, fingerprint_bytes, fingerprint_json

DOCS = [
    {"b": 1, "a": 2}, {"amount": 500, "currency": "eur"}, [], {}, "text", 0, -0.0, 1.0, 1e21, 1e-7, 0.1 + 0.2,
    123456789012345678901234567890, 2**53, 2**53 + 1, -(2**60), 5e-324, 1.7976931348623157e308,
    {"€": "\u00e9\u001f\"\\/", "\U0001f600": [None, True, False]},
    {"z": {"y": [1, {"b": 2, "a": 1}], "x": "\u2028"}, "10": 1, "1": 2, "a": 3, "A": 4, "é": 5, "\u00e9\u0301": 6},
]


STRING_PARTS = ["a", "Z", "0", "é", "\u0001", "\"", "\\", "\U0001f600", "\u2028", "\u00e9\u0301"]
KEY_PARTS = "abAB1é_\U0001f600"


def random_doc(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-10**20, 10**20) if rng.random() < 0.2 else rng.randint(-1000, 1000)
    if kind == 2:
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10 ** rng.randint(-30, 30),
                           float(rng.randint(0, 99))])
    if kind == 3:
        return "".join(rng.choice(STRING_PARTS) for _ in range(rng.randint(0, 6)))
    if kind in (4, 5):
        return {"".join(rng.choice(KEY_PARTS) for _ in range(rng.randint(0, 4))): random_doc(rng, depth + 1)
                for _ in range(rng.randint(0, 5))}
    return [random_doc(rng, depth + 1) for _ in range(rng.randint(0, 5))]


def server_fingerprint(conn, doc, ignore=()):
    return Idempotency().fingerprint(conn, doc, ignore)


@pytest.mark.parametrize("i", range(len(DOCS)))
def test_fixed_documents_agree(conn, i):
    doc = DOCS[i]
    assert fingerprint_json(doc) == server_fingerprint(conn, doc)


def test_random_documents_agree(conn):
    rng = random.Random(1717)
    for _ in range(300):
        doc = random_doc(rng)
        assert fingerprint_json(doc) == server_fingerprint(conn, doc), json.dumps(doc)


def test_ignored_top_level_fields(conn):
    doc = {"amount": 5, "currency": "eur", "request_id": "r-1", "nested": {"request_id": 1}}
    fp = fingerprint_json(doc, ["request_id"])
    assert fp == server_fingerprint(conn, doc, ["request_id"])
    assert fp == fingerprint_json({**doc, "request_id": "r-2"}, ["request_id"])
    assert fp != fingerprint_json(doc)


def test_body_text_forms_agree(conn):
    a = fingerprint_body(b'{"b": 1, "a": 2.0}')
    b = fingerprint_body(b'{"a":2,"b":1}')
    assert a == b == conn.execute("SELECT idempotency.idem_fingerprint(%s::jsonb)",
                                  ('{ "a": 2, "b": 1.0 }',)).fetchone()[0]


def test_bytes_fingerprint_agrees(conn):
    for body in (b"", b"not json", bytes(range(256)), b'{"a": NaN}'):
        expected = conn.execute("SELECT idempotency.idem_fingerprint(%s::bytea)", (body,)).fetchone()[0]
        assert fingerprint_bytes(body) == expected
        assert fingerprint_body(body) == expected
