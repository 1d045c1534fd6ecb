"""Framework-neutral HTTP pieces of the middleware: the Idempotency-Key header, the route
policy, RFC 9457 problem answers, and how responses are stored and replayed byte for byte.
No I/O here."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import timedelta
from http import HTTPStatus
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import http_sfv

from .client import Claim, Outcome
from .errors import unavailable

MAX_KEY_CHARS = 255
PROBLEM_TYPE = "application/problem+json"
REPLAYED_HEADER = ("Idempotent-Replayed", "true")

SAME_TRANSACTION = "same_transaction"
COMMITTED_FIRST = "committed_first"
Mode = Literal["same_transaction", "committed_first"]

# Answers that mean "the request was refused before any work": not stored, the key is
# released (committed first) or the transaction rolled back (same transaction), so the
# corrected request runs with the same key. 422 is among them: it is what FastAPI/Pydantic
# (and many APIs) answer to a body that fails validation, before the handler runs. The list is
# contract/contract.json's "refused_statuses" (tests/test_contract.py checks it).
REFUSED_STATUSES = frozenset({400, 401, 403, 404, 405, 406, 408, 411, 413, 414, 415, 422, 429})


@dataclass(frozen=True)
class RoutePolicy:
    """How one route is protected.

    mode            same_transaction: the handler gets the open transaction; claim, its
                    writes and the stored response commit together. committed_first: the
                    claim commits at once with `lease`, renewed while the handler runs.
    ignore_fields   top-level JSON fields left out of the fingerprint.
    required        a request without Idempotency-Key gets 400 (else it runs unprotected).
    lease / ttl     None: the extension's settings. lease is also the renewal period / 3.
    store_5xx       store 5xx answers (replayed later) instead of releasing the key.
    headers         response headers stored and replayed.
    wait            with an extension that has idem_claim(wait): how long a duplicate waits
                    for the owner before answering 409.
    """

    mode: Mode = SAME_TRANSACTION
    ignore_fields: tuple[str, ...] = ()
    required: bool = True
    lease: timedelta | None = timedelta(seconds=10)
    ttl: timedelta | None = None
    store_5xx: bool = False
    headers: tuple[str, ...] = ("Location", "Content-Type")
    wait: timedelta | None = None
    refused_statuses: frozenset[int] = field(default=REFUSED_STATUSES)

    def stores(self, status: int) -> bool:
        """Whether an answer with this status is stored (else the key is given back)."""
        if status >= 500:
            return self.store_5xx
        return status not in self.refused_statuses


@dataclass
class Answer:
    """An HTTP answer the middleware writes itself."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class Refused(Exception):
    """Raise it to answer at once with an RFC 9457 problem (`type` about:blank), from a tenant
    or scope function (before anything is claimed) or from a handler (the answer is not
    stored when its status is among the refused statuses, so the key stays free):

        raise Refused(status=401, title="Unauthorized", detail="an API key is required",
                      headers={"WWW-Authenticate": 'ApiKey realm="charges"'})

    Only `status` is required; `title` defaults to the status's reason phrase, and a problem
    without `detail` has none. `headers`: a mapping or (name, value) pairs."""

    def __init__(self, status: int, title: str | None = None, detail: str | None = None,
                 headers: Mapping[str, str] | Iterable[tuple[str, str]] = (), *, answer: Answer | None = None):
        super().__init__(detail or title or str(status))
        self.status = status
        pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
        self.answer = answer or problem(status, title or _reason(status), detail, pairs)

    @classmethod
    def contract(cls, slug: str, reason: str) -> Refused:
        """Refused with the contract's answer `slug`; `reason` (why) is the exception's message."""
        p = PROBLEMS[slug]
        return cls(p.status, p.title, reason, answer=contract_problem(slug))


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def problem(status: int, title: str, detail: str | None, headers: Iterable[tuple[str, str]] = (),
            type: str = "about:blank") -> Answer:
    """An RFC 9457 problem answer. The application's own problems are `about:blank`; the
    middleware's are the contract's (contract_problem)."""
    fields: dict[str, Any] = {"type": type, "title": title, "status": status}
    if detail is not None:
        fields["detail"] = detail
    return Answer(status, [("Content-Type", PROBLEM_TYPE), *headers], json.dumps(fields).encode())


@dataclass(frozen=True)
class Problem:
    """One of the contract's problem answers (contract/contract.json, "problems")."""

    status: int
    title: str
    detail: str
    retry_after: bool = False


# The middleware's answers, exactly as contract/contract.json gives them (tests/test_contract.py
# checks this table against it).
PROBLEM_TYPE_PREFIX = "urn:pg-idempotency:problem:"
PROBLEMS: dict[str, Problem] = {
    "idempotency-key-missing": Problem(400, "Idempotency-Key missing",
                                       "This request requires an Idempotency-Key header."),
    "idempotency-key-invalid": Problem(400, "Idempotency-Key invalid",
                                       "The Idempotency-Key header must appear once and hold 1 to 255 characters, "
                                       "none of them control characters."),
    "idempotency-key-in-progress": Problem(409, "Request in progress",
                                           "A request with this Idempotency-Key is still being processed. "
                                           "Retry later.", retry_after=True),
    "idempotency-key-superseded": Problem(409, "Request taken over",
                                          "This attempt lost its claim on the Idempotency-Key to a later one. "
                                          "Retry to get the result.", retry_after=True),
    "idempotency-key-reused": Problem(422, "Idempotency-Key reused",
                                      "This Idempotency-Key was used with a different request payload. "
                                      "Use a new key for a new request."),
    "idempotency-key-expired": Problem(410, "Idempotency-Key expired",
                                       "This Idempotency-Key was used and its stored response has expired. "
                                       "Use a new key."),
    "service-unavailable": Problem(503, "Service unavailable",
                                   "The database could not be reached; nothing was done. Retry later.",
                                   retry_after=True),
    "internal-error": Problem(500, "Internal server error", "The request failed."),
}

# The problem each outcome that runs nothing answers with (replay answers the stored response).
OUTCOME_PROBLEMS = {
    Outcome.IN_PROGRESS: "idempotency-key-in-progress",
    Outcome.MISMATCH: "idempotency-key-reused",
    Outcome.EXPIRED: "idempotency-key-expired",
}


def contract_problem(slug: str, retry_after: int = 1) -> Answer:
    """The contract's answer `slug`, with Retry-After (seconds, at least 1) where it has one."""
    p = PROBLEMS[slug]
    headers = [("Retry-After", str(max(1, retry_after)))] if p.retry_after else []
    return problem(p.status, p.title, p.detail, headers, type=PROBLEM_TYPE_PREFIX + slug)


# RFC 9110 tchar, ':' and '/' (an sf-token's characters): what a bare (unquoted) key may hold
# (contract/contract.json, "key_header").
_BARE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z:/]+")
# An RFC 8941 sf-string without escapes (printable ASCII but '"' and '\\'), e.g. a quoted UUID:
# its value is what lies between the quotes; anything else goes to http_sfv's parser.
_PLAIN_QUOTED = re.compile(rb'"([\x20\x21\x23-\x5b\x5d-\x7e]*)"')


def parse_key(values: Sequence[bytes]) -> str:
    """The key from the raw values of every Idempotency-Key field line; raises Refused(400).

    The contract's grammar: an RFC 8941 sf-string (parsed by http-sfv; parameters refused),
    or a bare value made only of RFC 9110 token characters, ":" and "/" (an sf-token's
    characters: bare UUIDs and k-1001, as most clients send them); 1-255
    characters after unquoting; exactly one field line."""
    if not values:
        raise Refused.contract("idempotency-key-missing", "this route requires an Idempotency-Key header")
    if len(values) > 1:
        raise Refused.contract("idempotency-key-invalid", "the Idempotency-Key header must appear once")
    raw = values[0].strip(b" \t")
    plain = _PLAIN_QUOTED.fullmatch(raw)
    if plain:
        value = plain.group(1).decode("ascii")
    elif raw.startswith(b'"'):
        item = http_sfv.Item()
        try:
            item.parse(raw)
        except ValueError:
            item.value = None
        if not isinstance(item.value, str) or item.params:
            raise Refused.contract("idempotency-key-invalid",
                                   "the Idempotency-Key must be a quoted string (RFC 8941) of printable ASCII")
        value = item.value
    elif _BARE.fullmatch(raw):
        value = raw.decode("ascii")
    else:
        raise Refused.contract("idempotency-key-invalid",
                               "an unquoted Idempotency-Key may hold only token characters (RFC 9110), ':' and '/'")
    if not 1 <= len(value) <= MAX_KEY_CHARS:
        raise Refused.contract("idempotency-key-invalid",
                               f"the Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters")
    return value


def is_json_type(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


# Kept in the stored response_headers beside the real ones (not a valid header name, so it
# never collides with one, and never sent): how a body that is not JSON was stored.
ENCODING_MARK = ":body-encoding"


def body_to_store(content_type: str | None, body: bytes) -> tuple[str, str | None]:
    """The response body as JSON text for idem_complete, and its encoding mark. JSON bodies
    are stored as they are (and sent in jsonb's text form, so the first answer and every
    replay agree byte for byte); other bodies as a JSON string: the text ("text"), or the
    base64 of the bytes when they are not UTF-8 or hold NUL ("base64")."""
    if is_json_type(content_type):
        try:
            text = body.decode("utf-8")
            json.loads(text, parse_constant=_refuse)
            return text, None
        except ValueError:
            pass
    try:
        text = body.decode("utf-8")
        if "\x00" not in text:  # jsonb strings cannot hold NUL
            return json.dumps(text), "text"
    except UnicodeDecodeError:
        pass
    return json.dumps(base64.b64encode(body).decode("ascii")), "base64"


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def body_to_send(stored_text: str | None, mark: str | None) -> bytes:
    """The bytes of a stored body (the inverse of body_to_store, jsonb text in)."""
    if stored_text is None:
        return b""
    if mark == "text":
        return json.loads(stored_text).encode("utf-8")
    if mark == "base64":
        return base64.b64decode(json.loads(stored_text))
    return stored_text.encode("utf-8")


def stored_answer(status: int, stored_headers: Mapping[str, Any] | None, stored_text: str | None) -> Answer:
    """The answer a stored response gives: the first time and on every replay alike."""
    stored = dict(stored_headers or {})
    mark = stored.pop(ENCODING_MARK, None)
    return Answer(status, [(str(n), str(v)) for n, v in stored.items()], body_to_send(stored_text, mark))


def selected_headers(headers: Iterable[tuple[str, str]], allow: Iterable[str]) -> dict[str, str]:
    """The allow-listed response headers, as stored (names as the allow-list spells them)."""
    wanted = {name.lower(): name for name in allow}
    return {wanted[n.lower()]: v for n, v in headers if n.lower() in wanted}


def storable(policy: RoutePolicy, headers: Iterable[tuple[str, str]], body: bytes) -> tuple[str, dict[str, str]]:
    """(body as JSON text, headers to store) for idem_complete."""
    headers = list(headers)
    text, mark = body_to_store(header_value(headers, "Content-Type"), body)
    stored = selected_headers(headers, policy.headers)
    if mark:
        stored[ENCODING_MARK] = mark
    return text, stored


def header_value(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    return next((v for n, v in headers if n.lower() == name.lower()), None)


def replay_answer(claim: Claim) -> Answer:
    answer = stored_answer(claim.response_status or 500, claim.response_headers, claim.response_body_text)
    answer.headers.append(REPLAYED_HEADER)
    return answer


def answer_without_work(claim: Claim) -> Answer:
    """The answer to every outcome but claimed / reclaimed."""
    if claim.outcome == Outcome.REPLAY:
        return replay_answer(claim)
    if claim.outcome in OUTCOME_PROBLEMS:
        return contract_problem(OUTCOME_PROBLEMS[claim.outcome], claim.retry_after or 1)
    raise ValueError(f"outcome {claim.outcome} needs work, not an answer")


def fenced_answer() -> Answer:
    """A committed-first handler whose claim was taken over meanwhile: not a success."""
    return contract_problem("idempotency-key-superseded")


def failure_answer(error: BaseException, handler_ran: bool) -> Answer:
    """The answer to an error the middleware met: 503 (Retry-After: 1) when the database could
    not be reached before the handler ran, since nothing was done and the same request can be
    repeated; else 500, as "nothing was done" may then be untrue."""
    if unavailable(error) and not handler_ran:
        return contract_problem("service-unavailable")
    return contract_problem("internal-error")


def default_scope(tenant: str, method: str, route: str) -> str:
    return f"{tenant}:{method} {route}"


ScopeFunction = Callable[..., str]
Headers = Mapping[str, str]
