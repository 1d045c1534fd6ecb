"""The framework-neutral HTTP pieces (no I/O): key parsing, storing and replaying bodies,
route templates, which statuses are stored."""

from __future__ import annotations

import json

import psycopg
import pytest

from pg_idempotency import Claim, Outcome, Refused, RoutePolicy, parse_key
from pg_idempotency.http import (ENCODING_MARK, REFUSED_STATUSES, answer_without_work, body_to_send, body_to_store,
                                 storable, stored_answer)
from pg_idempotency.routes import RouteTable


@pytest.mark.parametrize("raw,key", [
    (b'"abc"', "abc"), (b"abc", "abc"), (b'"a\\"b\\\\c"', 'a"b\\c'), (b"  \"x y\"  ", "x y"),
    (b"k-1001", "k-1001"), (b"tok-1:a/b", "tok-1:a/b"), (b"12.5", "12.5"), (b"7", "7"),
    (b"Tok_1.x~!#$%&'*+^`|", "Tok_1.x~!#$%&'*+^`|"),
    (b"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
    (b'"' + b"k" * 255 + b'"', "k" * 255), (b"k" * 255, "k" * 255), (b'"tok-1:a/b"', "tok-1:a/b"),
])
def test_keys_accepted(raw, key):
    assert parse_key([raw]) == key


@pytest.mark.parametrize("values", [
    [], [b'"a"', b'"b"'], [b'""'], [b""], [b'"' + b"k" * 256 + b'"'], [b"k" * 256], [b'"a\tb"'], [b'"abc'],
    [b'"abc";p=1'], [b'"a\\nb"'], [b"a b"], ['"café"'.encode()], [b'"a", "b"'], [b"?1"],
    # bare values outside RFC 9110 tchar (the contract's grammar), sf-tokens and byte sequences included
    [b":aGk=:"], [b"abc;p=1"], [b"a,b"], [b'a"b'], [b"(x)"], [b"k@example"],
])
def test_keys_refused_with_400(values):
    with pytest.raises(Refused) as e:
        parse_key(values)
    a = e.value.answer
    assert a.status == 400 and ("Content-Type", "application/problem+json") in a.headers
    assert json.loads(a.body)["status"] == 400


@pytest.mark.parametrize("content_type,body", [
    ("application/json", b'{"b": 1,  "a": [1, 2.50]}'), ("application/problem+json", b'"just a string"'),
    ("text/plain", b"hello\n"), ("text/plain", b'{"looks": "like json"}'),
    ("application/octet-stream", bytes(range(256))),
    ("text/plain", b"nul \x00 inside"), ("application/json", b"not json"), (None, b""),
])
def test_bodies_round_trip(content_type, body):
    text, mark = body_to_store(content_type, body)
    json.loads(text)  # always valid JSON for jsonb
    sent = body_to_send(text, mark)
    if mark is None:
        assert json.loads(sent) == json.loads(body)  # JSON: same value, jsonb's spelling
    else:
        assert sent == body


def test_storable_keeps_allow_listed_headers_and_the_mark():
    policy = RoutePolicy()
    text, stored = storable(policy, [("location", "/x/1"), ("Content-Type", "text/plain"), ("Set-Cookie", "s=1")],
                            b"hi")
    assert stored == {"Location": "/x/1", "Content-Type": "text/plain", ENCODING_MARK: "text"}
    answer = stored_answer(201, stored, text)
    assert answer.body == b"hi" and (ENCODING_MARK, "text") not in answer.headers
    assert ("Location", "/x/1") in answer.headers


def test_which_statuses_are_stored():
    p = RoutePolicy()
    assert p.stores(201) and p.stores(402) and p.stores(409)
    assert not p.stores(400) and not p.stores(401) and not p.stores(500) and not p.stores(503)
    assert not p.stores(422)  # a body that fails validation leaves the key free
    assert RoutePolicy(refused_statuses=REFUSED_STATUSES - {422}).stores(422)
    assert RoutePolicy(store_5xx=True).stores(500)


def test_route_templates():
    table = RouteTable({"POST /charges": RoutePolicy(), "POST /charges/{id}/refunds": RoutePolicy(store_5xx=True)})
    assert table.match("POST", "/charges")[0] == "/charges"
    assert table.match("post", "/charges/")[0] == "/charges"
    assert table.match("POST", "/charges/ch_1/refunds")[0] == "/charges/{id}/refunds"
    assert table.match("GET", "/charges") is None and table.match("POST", "/charges/x") is None
    with pytest.raises(ValueError):
        RouteTable({"POST charges": RoutePolicy()})


def claim_of(outcome, **kw):
    fields = dict(token=None, http_status=None, response_status=None, response_headers=None,
                  response_body_text=None, recovery_point=None, recovery_data=None, attempts=1,
                  expires_at=None, locked_until=None, retry_after=None)
    return Claim(outcome, **{**fields, **kw})


def test_answers_without_work():
    replay = answer_without_work(claim_of(Outcome.REPLAY, response_status=201, response_body_text='{"a": 1}',
                                          response_headers={"Location": "/x", "Content-Type": "application/json"}))
    assert (replay.status, replay.body) == (201, b'{"a": 1}')
    assert ("Idempotent-Replayed", "true") in replay.headers and ("Location", "/x") in replay.headers
    busy = answer_without_work(claim_of(Outcome.IN_PROGRESS, retry_after=7))
    assert busy.status == 409 and ("Retry-After", "7") in busy.headers
    assert answer_without_work(claim_of(Outcome.MISMATCH)).status == 422
    gone = answer_without_work(claim_of(Outcome.EXPIRED, response_status=201))
    assert gone.status == 410 and ("Content-Type", "application/problem+json") in gone.headers
    with pytest.raises(ValueError):
        answer_without_work(claim_of(Outcome.CLAIMED))


def test_which_database_errors_mean_unavailable():
    from psycopg import errors as pe
    from psycopg_pool import PoolTimeout

    from pg_idempotency.errors import unavailable
    from pg_idempotency.http import failure_answer

    for down in (psycopg.OperationalError("connection refused"), PoolTimeout("no connection in 5 s"),
                 pe.AdminShutdown(), pe.CannotConnectNow(), pe.TooManyConnections(), pe.ConnectionFailure(),
                 psycopg.InterfaceError("the connection is closed")):
        assert unavailable(down), down
        answer = failure_answer(down, handler_ran=False)
        assert answer.status == 503 and ("Retry-After", "1") in answer.headers
        assert json.loads(answer.body)["type"] == "urn:pg-idempotency:problem:service-unavailable"
        assert failure_answer(down, handler_ran=True).status == 500  # work may have been done
    wrapped = RuntimeError("django.db.utils.OperationalError")
    wrapped.__cause__ = psycopg.OperationalError("server closed the connection unexpectedly")
    assert unavailable(wrapped)
    for other in (pe.LockNotAvailable(), pe.QueryCanceled(), pe.UniqueViolation(), ValueError("x")):
        assert not unavailable(other), other
        assert failure_answer(other, handler_ran=False).status == 500


def test_refused_takes_keyword_arguments_and_defaults():
    r = Refused(status=401, title="Unauthorized", detail="an API key is required",
                headers={"WWW-Authenticate": 'ApiKey realm="x"'})
    assert r.answer.status == 401 and ("WWW-Authenticate", 'ApiKey realm="x"') in r.answer.headers
    assert json.loads(r.answer.body) == {"type": "about:blank", "title": "Unauthorized", "status": 401,
                                         "detail": "an API key is required"}
    short = Refused(401, "message")  # the positional form: status, title
    assert json.loads(short.answer.body) == {"type": "about:blank", "title": "message", "status": 401}
    assert json.loads(Refused(status=404).answer.body)["title"] == "Not Found"
    assert ("X-A", "1") in Refused(400, headers=[("X-A", "1")]).answer.headers
