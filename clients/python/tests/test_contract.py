"""The package against contract/contract.json, the repository's one description of the
contract: its outcome words, its SQLSTATE map, the refused statuses (the handler answers that
release the key) and every problem answer the middleware makes (type, title, detail, status,
Retry-After) are exactly the description's. No I/O."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pg_idempotency import Claim, Outcome, Refused, RoutePolicy, parse_key
from pg_idempotency.errors import BY_SQLSTATE
from pg_idempotency.http import (PROBLEM_TYPE, PROBLEM_TYPE_PREFIX, PROBLEMS, REFUSED_STATUSES, answer_without_work,
                                 contract_problem, fenced_answer)

CONTRACT = json.loads((Path(__file__).resolve().parents[3] / "contract" / "contract.json").read_text())
BY_SLUG = {p["slug"]: p for p in CONTRACT["problems"]}
OUTCOMES = {o["outcome"]: o for o in CONTRACT["outcomes"]}

CLAIM = Claim(outcome=Outcome.CLAIMED, token=None, http_status=None, response_status=None, response_headers=None,
              response_body_text=None, recovery_point=None, recovery_data=None, attempts=1, expires_at=None,
              locked_until=None, retry_after=None)


def assert_is_problem(answer, slug):
    """The answer is the description's problem `slug`, byte for byte in what it states."""
    p = BY_SLUG[slug]
    headers = {n.lower(): v for n, v in answer.headers}
    assert answer.status == p["status"], f"{slug}: status"
    assert headers["content-type"] == PROBLEM_TYPE
    assert json.loads(answer.body) == {"type": CONTRACT["problem_type_prefix"] + slug, "title": p["title"],
                                       "status": p["status"], "detail": p["detail"]}, slug
    assert ("retry-after" in headers) == ("Retry-After" in p.get("headers", [])), f"{slug}: Retry-After"
    if "retry-after" in headers:
        assert int(headers["retry-after"]) >= 1


def test_the_package_describes_the_contracts_problems_and_no_other():
    assert PROBLEM_TYPE_PREFIX == CONTRACT["problem_type_prefix"]
    assert sorted(PROBLEMS) == sorted(BY_SLUG)


@pytest.mark.parametrize("slug", sorted(BY_SLUG))
def test_problem_body_is_the_contracts(slug):
    assert_is_problem(contract_problem(slug), slug)


def test_outcome_words_are_the_contracts():
    assert sorted(o.value for o in Outcome) == sorted(OUTCOMES)


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
def test_outcome_answer_is_the_contracts(outcome):
    o = OUTCOMES[outcome]
    claim = replace(CLAIM, outcome=Outcome(outcome), retry_after=3, response_status=201,
                    response_headers={"Location": "/x"}, response_body_text='{"id": 1}')
    if o["http_status"] is None:  # the handler runs: no answer without work
        with pytest.raises(ValueError):
            answer_without_work(claim)
    elif o["http_status"] == "stored":
        answer = answer_without_work(claim)
        assert (answer.status, answer.body) == (201, b'{"id": 1}')
    else:
        answer = answer_without_work(claim)
        assert answer.status == o["http_status"]
        assert_is_problem(answer, o["problem"])


def test_in_progress_retry_after_is_the_lease_left():
    answer = answer_without_work(replace(CLAIM, outcome=Outcome.IN_PROGRESS, retry_after=7))
    assert ("Retry-After", "7") in answer.headers


@pytest.mark.parametrize("values,slug", [
    ([], "idempotency-key-missing"),
    ([b'"a"', b'"b"'], "idempotency-key-invalid"),
    ([b'""'], "idempotency-key-invalid"),
    ([b"a b"], "idempotency-key-invalid"),
    ([b'"' + b"k" * 256 + b'"'], "idempotency-key-invalid"),
])
def test_key_refusals_are_the_contracts(values, slug):
    with pytest.raises(Refused) as e:
        parse_key(values)
    assert_is_problem(e.value.answer, slug)


def test_a_claim_taken_over_answers_superseded():
    assert_is_problem(fenced_answer(), "idempotency-key-superseded")


def test_sqlstate_map_is_the_contracts():
    described = {s["code"] for s in CONTRACT["sqlstates"]}
    for_clients = {s["code"] for s in CONTRACT["sqlstates"] if s["client"]}
    assert set(BY_SQLSTATE) - described == set(), "codes the description does not give"
    assert for_clients - set(BY_SQLSTATE) == set(), "codes every client maps, missing here"
    for code, cls in BY_SQLSTATE.items():
        assert cls.sqlstate == code and (cls.__doc__ or "").startswith(code + ":"), cls


def test_refused_statuses_are_the_contracts_and_the_default():
    assert REFUSED_STATUSES == frozenset(CONTRACT["refused_statuses"]["statuses"])
    policy = RoutePolicy()
    assert policy.refused_statuses is REFUSED_STATUSES
    for status in CONTRACT["refused_statuses"]["statuses"]:
        assert not policy.stores(status), status
    for status in (200, 201, 204, 301, 402, 409, 410):
        assert policy.stores(status), status
