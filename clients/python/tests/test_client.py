"""The typed client against the real extension: every outcome, every mapped SQLSTATE,
sync and async."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime, timedelta

import psycopg
import pytest

from pg_idempotency import (AlreadyCompleted, AsyncIdempotency, Idempotency, InvalidArgument, LockTimeout,
                            NoLiveRecord, NotOwner, NullArgument, Outcome, PermissionDenied, ReadOnlyServer,
                            ResponseTooLarge, SerializationFailure, UnsupportedByExtension)

idem = Idempotency()


def key() -> str:
    return f"k-{uuid.uuid4()}"


def test_claimed_then_replay_with_the_stored_response(conn):
    k = key()
    c = idem.claim(conn, "s1", k, "fp-1")
    assert c.outcome == Outcome.CLAIMED and c.owned and isinstance(c.token, uuid.UUID) and c.attempts == 1
    sent = idem.complete(conn, "s1", k, c.token, 201, {"b": 1, "a": [1.0, "x"]}, {"Location": "/x/1"})
    assert sent == '{"a": [1.0, "x"], "b": 1}'  # jsonb's text form, what a replay sends
    r = idem.claim(conn, "s1", k, "fp-1")
    assert r.outcome == Outcome.REPLAY and not r.owned and r.http_status == 201 and r.response_status == 201
    assert r.response_body_text == sent and r.response_body == {"a": [1.0, "x"], "b": 1}
    assert r.response_headers == {"Location": "/x/1"}


def test_mismatch(conn):
    k = key()
    c = idem.claim(conn, "s1", k, "fp-1")
    idem.complete(conn, "s1", k, c.token, 200)
    m = idem.claim(conn, "s1", k, "fp-2")
    assert m.outcome == Outcome.MISMATCH and m.http_status == 422


def test_in_progress_with_retry_after_from_the_lease(conn):
    k = key()
    idem.claim(conn, "s1", k, lease=timedelta(seconds=30))  # autocommit: committed first
    p = idem.claim(conn, "s1", k)
    assert p.outcome == Outcome.IN_PROGRESS and p.http_status == 409
    assert 29 <= p.retry_after <= 30 and isinstance(p.locked_until, datetime)


def test_reclaimed_after_the_lease_with_the_checkpoint(conn):
    k = key()
    c = idem.claim(conn, "s1", k, lease=timedelta(seconds=1))
    until = idem.checkpoint(conn, "s1", k, c.token, "step-1", {"n": 1}, lease=timedelta(milliseconds=200))
    assert isinstance(until, datetime)
    time.sleep(0.4)
    r = idem.claim(conn, "s1", k)
    assert r.outcome == Outcome.RECLAIMED and r.token != c.token and r.attempts == 2
    assert (r.recovery_point, r.recovery_data) == ("step-1", {"n": 1})
    with pytest.raises(NotOwner):  # the old owner is fenced
        idem.complete(conn, "s1", k, c.token, 201)
    assert idem.release(conn, "s1", k, c.token) is False
    idem.complete(conn, "s1", k, r.token, 201, {"ok": True})


def test_release_lookup_and_seen(conn):
    k = key()
    c = idem.claim(conn, "s1", k, "fp")
    rec = idem.lookup(conn, "s1", k)
    assert rec is not None and rec.status == "in_progress" and rec.token == c.token and rec.fingerprint == "fp"
    assert idem.release(conn, "s1", k, c.token) is True
    assert idem.lookup(conn, "s1", k) is None
    assert idem.claim(conn, "s1", k, "fp").outcome == Outcome.CLAIMED
    m = f"m-{uuid.uuid4()}"
    assert idem.seen(conn, "consumer", m) is True
    assert idem.seen(conn, "consumer", m) is False


def test_seen_many_when_the_extension_has_it(conn, extension_features):
    ids = [f"m-{uuid.uuid4()}" for _ in range(3)]
    if not extension_features.seen_many:
        with pytest.raises(UnsupportedByExtension):
            idem.seen_many(conn, "consumer", ids)
        pytest.skip(f"the installed extension ({extension_features.version}) has no idem_seen_many "
                    "(contract round 2); checked that the client refuses it before sending")
    assert idem.seen_many(conn, "consumer", [ids[0], ids[1], ids[0]]) == [True, True, False]
    assert idem.seen_many(conn, "consumer", ids) == [False, False, True]


def test_wait_and_token_refused_or_used(conn, extension_features):
    k = key()
    if not extension_features.claim_token:
        with pytest.raises(UnsupportedByExtension):
            idem.claim(conn, "s1", k, token=uuid.uuid4())
    else:
        t = uuid.uuid4()
        assert idem.claim(conn, "s1", k, token=t).token == t
        again = idem.claim(conn, "s1", k, token=t)  # safe to retry: same owner, nothing written
        assert again.outcome == Outcome.CLAIMED and again.token == t and again.attempts == 1
    if not extension_features.claim_wait:
        with pytest.raises(UnsupportedByExtension):
            idem.claim(conn, "s1", key(), wait=timedelta(seconds=1))
        pytest.skip(f"the installed extension ({extension_features.version}) has no idem_claim(wait, token) "
                    "(contract round 2); checked that the client refuses them before sending")


def test_expired_outcome_with_tombstones(conn, extension_features):
    # Tombstones came with wait and token (release 0.4.0). pg_settings would only list the
    # setting once this connection has loaded the extension's library.
    if not extension_features.claim_wait:
        pytest.skip(f"the installed extension ({extension_features.version}) has no tombstones (contract round 2)")
    k = key()
    with conn.transaction():
        conn.execute("SET LOCAL idempotency.tombstone_ttl = '1 hour'")
        c = idem.claim(conn, "s1", k, "fp", ttl=timedelta(milliseconds=200))
        idem.complete(conn, "s1", k, c.token, 201)
    time.sleep(0.4)
    with conn.transaction():
        conn.execute("SET LOCAL idempotency.tombstone_ttl = '1 hour'")
        e = idem.claim(conn, "s1", k, "fp")
    assert e.outcome == Outcome.EXPIRED and e.http_status == 410 and e.response_status == 201


def test_errors_null_and_invalid_arguments(conn):
    with pytest.raises(NullArgument) as e:
        idem.claim(conn, None, key())  # type: ignore[arg-type]
    assert e.value.sqlstate == "22004" and isinstance(e.value.__cause__, psycopg.Error)
    with pytest.raises(InvalidArgument):
        idem.claim(conn, "s1", "")
    with pytest.raises(InvalidArgument):
        idem.claim(conn, "s1", "k" * 256)
    with pytest.raises(InvalidArgument):
        idem.claim(conn, "s1", key(), lease=timedelta(seconds=-1))
    c = idem.claim(conn, "s1", k := key())
    with pytest.raises(InvalidArgument):
        idem.complete(conn, "s1", k, c.token, 99)
    assert idem.lookup(conn, "s1", k).status == "in_progress"  # nothing written by the failed call


def test_errors_ownership(conn):
    with pytest.raises(NoLiveRecord):
        idem.complete(conn, "s1", key(), uuid.uuid4(), 201)
    k = key()
    c = idem.claim(conn, "s1", k)
    with pytest.raises(NotOwner):
        idem.checkpoint(conn, "s1", k, uuid.uuid4(), "p")
    idem.complete(conn, "s1", k, c.token, 201)
    with pytest.raises(AlreadyCompleted):
        idem.complete(conn, "s1", k, c.token, 201)


def test_error_response_too_large(conn):
    k = key()
    c = idem.claim(conn, "s1", k)
    with conn.transaction():
        conn.execute("SET LOCAL idempotency.max_response_size = '1kB'")
        with pytest.raises(ResponseTooLarge):
            idem.complete(conn, "s1", k, c.token, 200, {"x": "y" * 5000})


def test_error_read_only(conn):
    with conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(ReadOnlyServer):
            idem.claim(conn, "s1", key())


def test_error_serialization_failure(conn, db_url):
    k = key()
    with psycopg.connect(db_url) as other:
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")  # the snapshot is taken
        idem.claim(conn, "s1", k)  # committed after it
        with pytest.raises(SerializationFailure):
            idem.claim(other, "s1", k)


def test_error_lock_timeout(conn, db_url):
    k = key()
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url) as waiter:
        idem.claim(holder, "s1", k)  # uncommitted claim
        waiter.execute("SET lock_timeout = '100ms'")
        with pytest.raises(LockTimeout):
            idem.claim(waiter, "s1", k)


def test_error_permission_denied(conn, db_url):
    conn.execute("DROP ROLE IF EXISTS idem_py_nobody")
    conn.execute("CREATE ROLE idem_py_nobody")
    try:
        with psycopg.connect(db_url) as c:
            c.execute("SET ROLE idem_py_nobody")
            with pytest.raises(PermissionDenied):
                idem.claim(c, "s1", key())
    finally:
        conn.execute("DROP ROLE idem_py_nobody")


def test_async_client_outcomes_and_errors(db_url):
    aidem = AsyncIdempotency()

    async def run():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            k = key()
            first = await aidem.claim(c, "s-async", k, "fp", lease=timedelta(seconds=30))
            busy = await aidem.claim(c, "s-async", k, "fp")
            assert await aidem.checkpoint(c, "s-async", k, first.token, "p1") is not None
            rec = await aidem.lookup(c, "s-async", k)
            sent = await aidem.complete(c, "s-async", k, first.token, 201, {"id": 1})
            replay = await aidem.claim(c, "s-async", k, "fp")
            with pytest.raises(AlreadyCompleted):
                await aidem.complete(c, "s-async", k, first.token, 201)
            k2 = key()
            second = await aidem.claim(c, "s-async", k2)
            released = await aidem.release(c, "s-async", k2, second.token)
            seen = [await aidem.seen(c, "s-async", k2), await aidem.seen(c, "s-async", k2)]
            fp = await aidem.fingerprint(c, {"b": 1, "a": 2})
            return first, busy, rec, sent, replay, released, seen, fp

    first, busy, rec, sent, replay, released, seen, fp = asyncio.run(run())
    assert first.outcome == Outcome.CLAIMED and busy.outcome == Outcome.IN_PROGRESS and busy.retry_after >= 29
    assert rec.recovery_point == "p1"
    assert replay.outcome == Outcome.REPLAY and replay.response_body_text == sent == '{"id": 1}'
    assert released is True and seen == [True, False] and fp.startswith("sha256:")


HOSTILE = ["'", "''", "\\", "\\\\'", "\\'; DROP TABLE idempotency.keys; --", "E'x'", "$$", "$1", "%s", "%(key)s",
           "a'b\\c\"d", "'); COMMIT; SELECT ('", "é€𝄞 ключ キー", "\\x41\\u0041\\101", "\u2028\ufeff"]


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_begin_and_claim_then_complete_and_commit_with_hostile_text(db_url, conforming):
    """The one-round-trip pair quotes its arguments on the client (psycopg, libpq's escaping):
    hostile scopes, keys, fingerprints, headers and bodies are stored as they are, whatever
    standard_conforming_strings says."""
    aidem = AsyncIdempotency()

    async def run():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            await c.execute(f"SET standard_conforming_strings = {conforming}")
            for text in HOSTILE:
                scope, k = f"hostile {text}", f"{text} {uuid.uuid4()}"
                claim = await aidem.begin_and_claim(c, scope, k, f"fp {text}", lease=timedelta(seconds=5))
                assert claim.outcome == Outcome.CLAIMED
                assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
                body = json.dumps({"text": text})
                sent = await aidem.complete_and_commit(c, scope, k, claim.token, 201, {"Location": text}, body)
                assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                rec = await aidem.lookup(c, scope, k)
                assert json.loads(sent) == {"text": text}
                assert (rec.status, rec.fingerprint) == ("completed", f"fp {text}")
                assert rec.response_headers == {"Location": text} and rec.response_body == {"text": text}

    asyncio.run(run())


def test_a_failed_completion_does_not_commit(db_url):
    """complete_and_commit with a token that does not own the key: IK002, COMMIT not run, the
    transaction left aborted; its rollback takes the claim with it."""
    aidem = AsyncIdempotency()

    async def run():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            k = key()
            await aidem.begin_and_claim(c, "s-fail", k)
            with pytest.raises(NotOwner):
                await aidem.complete_and_commit(c, "s-fail", k, uuid.uuid4(), 201, None, "{}")
            status = c.info.transaction_status
            await c.rollback()
            return status, await aidem.lookup(c, "s-fail", k)

    status, record = asyncio.run(run())
    assert status == psycopg.pq.TransactionStatus.INERROR and record is None
