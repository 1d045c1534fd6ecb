"""The demo apps (FastAPI under uvicorn, Django under gunicorn) over real HTTP against the
real extension: what issue 17 asks every middleware to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from pg_idempotency import Idempotency, Outcome, fingerprint_body

from conftest import APPS, TEST_LEASE_MS, Server, has_tombstones

ROUTES = ("/charges", "/charges/external")
AMOUNT = {"amount": 500, "currency": "eur"}


def new_key() -> str:
    return f'"{uuid.uuid4()}"'


def tenant() -> str:
    return "acct_" + uuid.uuid4().hex[:10]


def charges(db_url: str, tenant_: str) -> int:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT count(*) FROM charges WHERE tenant = %s", (tenant_,)).fetchone()[0]


def records(db_url: str, tenant_: str) -> int:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT count(*) FROM idempotency.keys WHERE starts_with(scope, %s)",
                         (tenant_ + ":",)).fetchone()[0]


@pytest.mark.parametrize("kind", sorted(APPS))
@pytest.mark.parametrize("argv,complaint", [
    ([], "--database-url"), (["--database-url", "postgresql://x/y"], "--listen"),
    (["--listen", "nowhere", "--database-url", "postgresql://x/y"], "--listen"),
    (["--listen", "127.0.0.1:1", "--database-url", "postgresql://x/y", "--lease-ms", "0"], "--lease-ms"),
])
def test_demo_refuses_bad_options(kind, argv, complaint):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LISTEN_ADDR")}
    done = subprocess.run([str(APPS[kind]), *argv], capture_output=True, text=True, timeout=60,
                          env={**env, "IDEM_PY_PYTHON": sys.executable})
    error = done.stderr.strip().splitlines()[-1]  # argparse: usage, then "PROG: error: ..."
    assert done.returncode == 2 and "error:" in error and complaint in error, done.stderr


def test_healthz(app: Server):
    r = app.get("/healthz", None)
    assert (r.status, r.body) == (200, b"ok\n")


@pytest.mark.parametrize("route", ROUTES)
def test_missing_tenant_401_before_the_key(app, route, db_url):
    r = app.post(route, AMOUNT, None, None)
    assert r.is_problem(401) and "www-authenticate" in r.headers


@pytest.mark.parametrize("route", ROUTES)
def test_missing_key_400_nothing_claimed(app, route, db_url):
    t = tenant()
    r = app.post(route, AMOUNT, None, t)
    assert r.is_problem(400), r
    assert records(db_url, t) == 0 and charges(db_url, t) == 0


BAD_KEYS = {
    "empty quoted": '""',
    "256 characters": '"' + "k" * 256 + '"',
    "tab inside": '"a\tb"',
    "no closing quote": '"abc',
    "parameters": '"abc";p=1',
    "bad escape": '"a\\nb"',
    "space in a bare value": "a b",
    "non-ASCII": '"caf\u00e9"',
    "a list": '"a", "b"',
}


@pytest.mark.parametrize("name", sorted(BAD_KEYS))
def test_malformed_key_400_nothing_claimed(app, name, db_url):
    t = tenant()
    r = app.post("/charges", AMOUNT, BAD_KEYS[name], t)
    assert r.is_problem(400), r
    assert records(db_url, t) == 0 and charges(db_url, t) == 0


def stored_keys(db_url: str, tenant_: str) -> set[str]:
    with psycopg.connect(db_url) as c:
        return {k for (k,) in c.execute("SELECT key FROM idempotency.keys WHERE starts_with(scope, %s)",
                                         (tenant_ + ":",))}


def test_key_spaces_inside_quotes_escapes_and_spaces_around(app, db_url):
    """README.md, Key: spaces inside the quotes are the key's, \\" an escaped quote; spaces
    around the value are not part of it (the server drops them)."""
    t = tenant()
    spaced = app.post("/charges", AMOUNT, '"order 1 a"', t)
    padded = app.post("/charges", AMOUNT, '   "order 1 a"  ', t)
    assert spaced.status == 201 and not spaced.replayed and padded.replayed and padded.body == spaced.body
    bare = app.post("/charges", AMOUNT, "  k-padded ", t)
    assert bare.status == 201 and app.post("/charges", AMOUNT, "k-padded", t).replayed
    assert app.post("/charges", AMOUNT, '"a\\"b"', t).status == 201
    assert stored_keys(db_url, t) == {"order 1 a", "k-padded", 'a"b'}


CONTROL_KEYS = {"SOH between the quotes": '"a\x01b"', "DEL between the quotes": '"a\x7fb"',
                "SOH in a bare value": "a\x01b", "NUL": '"a\x00b"'}


@pytest.mark.parametrize("name", sorted(CONTROL_KEYS))
def test_control_characters_400_from_the_server_or_the_middleware(app, name, db_url):
    """README.md, Key: uvicorn hands every control character but NUL to the app, where the
    middleware refuses it (its problem); gunicorn refuses every one but the tab itself."""
    t = tenant()
    r = app.post("/charges", AMOUNT, CONTROL_KEYS[name], t)
    assert r.status == 400, r
    assert r.is_problem(400) == (app.kind == "asgi" and name != "NUL"), r
    assert records(db_url, t) == 0


@pytest.mark.parametrize("route", ROUTES)
def test_duplicated_key_field_400(app, route, db_url):
    t = tenant()
    r = app.post(route, AMOUNT, '"k-a"', t, extra=[("Idempotency-Key", '"k-b"')])
    assert r.is_problem(400), r
    assert records(db_url, t) == 0


def test_quoted_and_bare_key_are_one_key_and_255_chars_work(app, db_url):
    t = tenant()
    r1 = app.post("/charges", AMOUNT, '"k-1001"', t)
    r2 = app.post("/charges", AMOUNT, "k-1001", t)
    assert r1.status == 201 and not r1.replayed and r2.status == 201 and r2.replayed and r1.body == r2.body
    assert app.post("/charges", AMOUNT, "tok 1", t).is_problem(400)  # bare: an sf-token's characters only
    bare = app.post("/charges", AMOUNT, "tok-1:a/b", t)
    quoted = app.post("/charges", AMOUNT, '"tok-1:a/b"', t)
    assert bare.status == 201 and not bare.replayed and quoted.status == 201 and quoted.replayed
    r3 = app.post("/charges", AMOUNT, '"' + "k" * 255 + '"', t)
    assert r3.status == 201 and not r3.replayed
    r4 = app.post("/charges", AMOUNT, str(uuid.uuid4()), t)  # a bare UUID (may start with a digit)
    assert r4.status == 201


@pytest.mark.parametrize("route", ROUTES)
def test_replay_byte_for_byte(app, route, db_url):
    t, key = tenant(), new_key()
    first = app.post(route, AMOUNT, key, t)
    assert first.status == 201 and not first.replayed, first
    body = first.json()
    assert body["amount"] == 500 and body["currency"] == "eur" and body["id"].startswith("ch_")
    assert first.headers["location"] == f"/charges/{body['id']}"
    again = app.post(route, AMOUNT, key, t)
    assert again.status == 201 and again.replayed
    assert again.body == first.body
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert charges(db_url, t) == 1
    got = app.get(first.headers["location"], t)
    assert got.status == 200 and got.json()["id"] == body["id"]
    assert app.get(first.headers["location"], tenant()).is_problem(404)


@pytest.mark.parametrize("route", ROUTES)
def test_same_key_other_body_422(app, route, db_url):
    t, key = tenant(), new_key()
    assert app.post(route, AMOUNT, key, t).status == 201
    r = app.post(route, {"amount": 501, "currency": "eur"}, key, t)
    assert r.is_problem(422), r
    assert charges(db_url, t) == 1


@pytest.mark.parametrize("route", ROUTES)
def test_invalid_body_400_leaves_the_key_free(app, route, db_url):
    t, key = tenant(), new_key()
    assert app.post(route, b'{"amount": "lots"', key, t).is_problem(400)
    assert app.post(route, {"amount": -5, "currency": "eur"}, key, t).is_problem(400)
    assert records(db_url, t) == 0
    good = app.post(route, AMOUNT, key, t)
    assert good.status == 201 and not good.replayed


def test_slow_handler_409_with_retry_after_from_the_lease(app, db_url):
    t, key = tenant(), new_key()
    slow: dict = {}
    worker = threading.Thread(target=lambda: slow.update(r=app.post(
        "/charges/external", AMOUNT, key, t, extra=[("X-Fault-Delay-Ms", str(TEST_LEASE_MS * 2))])))
    worker.start()
    deadline = time.monotonic() + 10
    while records(db_url, t) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(TEST_LEASE_MS / 1000 * 1.2)  # past the first lease: renewals keep it
    r = app.post("/charges/external", AMOUNT, key, t)
    assert r.is_problem(409), r
    retry_after = int(r.headers["retry-after"])
    with psycopg.connect(db_url) as c:
        left = c.execute("SELECT extract(epoch FROM locked_until - clock_timestamp()) FROM idempotency.keys "
                         "WHERE starts_with(scope, %s)", (t + ":",)).fetchone()[0]
    assert 1 <= retry_after <= TEST_LEASE_MS / 1000 and abs(retry_after - float(left)) <= 1.5, (retry_after, left)
    worker.join(30)
    assert slow["r"].status == 201 and not slow["r"].replayed
    after = app.post("/charges/external", AMOUNT, key, t)
    assert after.status == 201 and after.replayed and after.body == slow["r"].body
    assert charges(db_url, t) == 1


@pytest.mark.parametrize("route", ROUTES)
def test_12_concurrent_identical_requests_one_side_effect(app, route, db_url):
    t, key = tenant(), new_key()
    delay = [("X-Fault-Delay-Ms", "300")] if route.endswith("external") else []
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: app.post(route, AMOUNT, key, t, extra=delay), range(12)))
    firsts = [r for r in replies if r.status == 201 and not r.replayed]
    replays = [r for r in replies if r.status == 201 and r.replayed]
    conflicts = [r for r in replies if r.is_problem(409) and int(r.headers["retry-after"]) >= 1]
    assert len(firsts) == 1, [(r.status, r.body[:80]) for r in replies]
    assert len(replays) + len(conflicts) == 11
    assert all(r.body == firsts[0].body for r in replays)
    assert charges(db_url, t) == 1
    again = app.post(route, AMOUNT, key, t)
    assert again.replayed and again.body == firsts[0].body


@pytest.mark.parametrize("route", ROUTES)
def test_handler_failing_before_its_side_effect_leaves_the_key_free(app, route, db_url):
    t, key = tenant(), new_key()
    r = app.post(route, AMOUNT, key, t, extra=[("X-Fault-Fail-Before", "1")])
    assert r.is_problem(500), r
    assert records(db_url, t) == 0 and charges(db_url, t) == 0
    again = app.post(route, AMOUNT, key, t)
    assert again.status == 201 and not again.replayed
    assert charges(db_url, t) == 1


def test_takeover_fences_the_late_side_effect_and_completion(app, db_url):
    """Another owner takes the claim over while the handler sleeps: the handler's step is
    refused (its charge rolls back) and it answers 409, not a success."""
    t, raw_key = tenant(), str(uuid.uuid4())
    slow: dict = {}
    worker = threading.Thread(target=lambda: slow.update(r=app.post(
        "/charges/external", AMOUNT, f'"{raw_key}"', t, extra=[("X-Fault-Delay-Ms", "2500")])))
    worker.start()
    deadline = time.monotonic() + 10
    while records(db_url, t) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    scope = f"{t}:POST /charges/external"
    with psycopg.connect(db_url) as c:  # one transaction: the lease ends and the claim is taken over
        c.execute("UPDATE idempotency.keys SET locked_until = now() - interval '1 second' "
                  "WHERE scope = %s AND key = %s", (scope, raw_key))
        claim = Idempotency().claim(c, scope, raw_key, fingerprint_body(json.dumps(AMOUNT).encode()))
        assert claim.outcome == Outcome.RECLAIMED
        Idempotency().complete(c, scope, raw_key, claim.token, 201, {"taken": "over"},
                               {"Content-Type": "application/json"})
    worker.join(30)
    assert slow["r"].is_problem(409) and slow["r"].headers["retry-after"] == "1", slow["r"]
    assert charges(db_url, t) == 0
    again = app.post("/charges/external", AMOUNT, f'"{raw_key}"', t)
    assert again.status == 201 and again.replayed and again.json() == {"taken": "over"}


@pytest.mark.parametrize("kind", ["asgi", "django"])
def test_server_killed_mid_handler_retry_completes_once(kind, db_url, log_dir):
    server = Server(kind, db_url, log_dir).start()
    t, key = tenant(), new_key()
    try:
        threading.Thread(target=lambda: _ignore(lambda: server.post(
            "/charges/external", AMOUNT, key, t, extra=[("X-Fault-Delay-Ms", "60000")])), daemon=True).start()
        deadline = time.monotonic() + 10
        while records(db_url, t) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert records(db_url, t) == 1, "the claim was not made"
        server.kill()
        server.start()
        statuses = []
        deadline = time.monotonic() + TEST_LEASE_MS / 1000 * 4
        while time.monotonic() < deadline:
            r = server.post("/charges/external", AMOUNT, key, t)
            statuses.append(r.status)
            if r.status != 409:
                break
            time.sleep(0.25)
        assert r.status == 201 and not r.replayed, (statuses, r)
        assert set(statuses[:-1]) <= {409}
        assert charges(db_url, t) == 1
        again = server.post("/charges/external", AMOUNT, key, t)
        assert again.replayed and again.body == r.body
    finally:
        server.stop()


def _ignore(fn):
    try:
        fn()
    except OSError:
        pass


def test_expired_410_with_tombstones(app, db_url, extension_features):
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT idempotency.idem_fingerprint('{}'::jsonb)")
        if not has_tombstones(c):
            pytest.skip(f"the installed extension ({extension_features.version}) has no tombstones "
                        "(idempotency.tombstone_ttl, contract round 2)")
    t, key = tenant(), new_key()
    first = app.post("/charges", AMOUNT, key, t)
    assert first.status == 201
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE idempotency.keys SET expires_at = now() - interval '1 second' "
                  "WHERE starts_with(scope, %s)", (t + ":",))
    assert app.post("/charges", AMOUNT, key, t).is_problem(410)
