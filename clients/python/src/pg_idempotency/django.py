"""Django middleware (WSGI or ASGI with sync views), on Django's own database connection
(the psycopg 3 backend), so same-transaction handlers write with the ORM in the claim's
transaction.

    MIDDLEWARE = [..., "pg_idempotency.django.IdempotencyMiddleware"]
    IDEMPOTENCY = {
        "ROUTES": {"POST /charges": RoutePolicy(),
                   "POST /charges/external": RoutePolicy(mode=COMMITTED_FIRST)},
        "TENANT": "myapp.auth.tenant_of",     # callable(request) -> str, or its dotted path
        "DATABASE": "default",
    }

Views find an `IdempotencyContext` in `request.idempotency`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import psycopg
from django.conf import settings
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from . import http
from .client import Claim, Idempotency
from .context import ClaimContext
from .errors import IdempotencyError, NoLiveRecord, NotOwner, ended_uncommitted, unavailable
from .fingerprint import fingerprint_body
from .health import is_dead, last_words
from .http import COMMITTED_FIRST, Answer, Refused, RoutePolicy
from .routes import RouteTable

log = logging.getLogger("pg_idempotency")

def default_tenant(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return str(user.pk) if user is not None and getattr(user, "is_authenticated", False) else "anonymous"


def raw_connection(alias: str) -> psycopg.Connection:
    """The psycopg connection under Django's connection `alias` (this thread's)."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    return wrapper.connection


def forget_if_closed(alias: str) -> None:
    """Inside an atomic block: a connection the server closed is closed on Django's side too,
    so that leaving the block neither rolls back on it nor opens a new one to restore
    autocommit (which, with the database down, would raise over the answer)."""
    wrapper = connections[alias]
    if wrapper.connection is not None and wrapper.connection.closed:
        wrapper.close()


# How many connections found dead are replaced in a row (each one a pool could hold).
_REPLACEMENTS = 16


def live_connection(alias: str) -> psycopg.Connection:
    """raw_connection(alias), replaced first if the server closed it while it sat idle (a
    persistent connection, CONN_MAX_AGE, or one of Django's pool, across a database restart):
    nothing is sent to find out (pg_idempotency.health). Within an atomic block the connection
    is the application's transaction's, and left as it is."""
    wrapper = connections[alias]
    for _ in range(_REPLACEMENTS):
        conn = raw_connection(alias)
        if wrapper.in_atomic_block or not is_dead(conn):
            return conn
        log.info("Django's connection %r was closed by the server (a restart?): opening another", alias)
        wrapper.close()
    return raw_connection(alias)


class IdempotencyContext(ClaimContext):
    """What a protected view gets: the claim, and for committed-first routes `step()` to
    run a side effect fenced and recorded."""

    def __init__(self, client: Idempotency, alias: str, scope: str, key: str | None, claim: Claim | None,
                 policy: RoutePolicy):
        super().__init__(scope, key, claim, policy)
        self.client, self.alias = client, alias
        self._lock = threading.Lock()

    @contextmanager
    def step(self, recovery_point: str, recovery_data: Any = None) -> Iterator[None]:
        """Committed-first: one side effect in a transaction (use the ORM inside) that
        commits together with its checkpoint; NotOwner (taken over) rolls it back."""
        with self._lock, transaction.atomic(using=self.alias):
            yield
            if self.key is not None:  # without a key (required=False) there is no record
                self.client.checkpoint(raw_connection(self.alias), self.scope, self.key,  # type: ignore[arg-type]
                                       self.token, recovery_point, recovery_data, self.policy.lease)
        self.point, self.data = recovery_point, recovery_data

    def renew(self) -> None:
        """From the renewal thread, on that thread's own connection."""
        with self._lock:
            self.client.checkpoint(raw_connection(self.alias), self.scope, self.key, self.token,  # type: ignore[arg-type]
                                   self.renewal_point(), self.data, self.policy.lease)


class LeaseKeeper(threading.Thread):
    def __init__(self, ctx: IdempotencyContext):
        super().__init__(daemon=True, name=f"lease {ctx.key}")
        self.ctx, self.stopped = ctx, threading.Event()

    def run(self) -> None:
        period = (self.ctx.policy.lease.total_seconds() if self.ctx.policy.lease else 300) / 3
        try:
            while not self.stopped.wait(period):
                try:
                    self.ctx.renew()
                except NotOwner:
                    self.ctx.lost = True
                    log.warning("lease of %s / %s lost: taken over", self.ctx.scope, self.ctx.key)
                    return
                except Exception as e:
                    log.warning("lease renewal of %s / %s failed: %s", self.ctx.scope, self.ctx.key, e)
        finally:
            connections[self.ctx.alias].close()

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def to_response(answer: Answer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status)
    for name, value in answer.headers:
        if name.lower() != "content-length":
            response[name] = value
    response["Content-Length"] = str(len(answer.body))
    return response


class _RolledBack(Exception):
    def __init__(self, response: HttpResponse):
        self.response = response


def unavailable_response() -> HttpResponse:
    return to_response(http.contract_problem("service-unavailable"))


class IdempotencyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        config = getattr(settings, "IDEMPOTENCY", {})
        self.routes = RouteTable(config.get("ROUTES", {}))
        tenant = config.get("TENANT", default_tenant)
        self.tenant = import_string(tenant) if isinstance(tenant, str) else tenant
        scope_function = config.get("SCOPE", http.default_scope)
        self.scope_function = import_string(scope_function) if isinstance(scope_function, str) else scope_function
        self.alias = config.get("DATABASE", "default")
        self.client = Idempotency()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        match = self.routes.match(request.method or "", request.path_info)
        if match is None:
            return self.get_response(request)
        template, policy = match
        try:
            tenant = self.tenant(request)
            raw = request.META.get("HTTP_IDEMPOTENCY_KEY")
            # WSGI joins repeated header lines with "," (which no valid key holds).
            key = http.parse_key([] if raw is None else [raw.encode("latin-1")]) \
                if raw is not None or policy.required else None
            idem_scope = self.scope_function(tenant, request.method, template)
        except Refused as r:
            return to_response(r.answer)
        except Exception:
            log.exception("%s %s: the tenant or scope function failed", request.method, template)
            return to_response(http.contract_problem("internal-error"))
        if key is None:
            return self.without_key(request, idem_scope, policy)
        fingerprint = fingerprint_body(request.body, policy.ignore_fields)
        try:
            if policy.mode == COMMITTED_FIRST:
                return self.committed_first(request, idem_scope, key, fingerprint, policy)
            return self.same_transaction(request, idem_scope, key, fingerprint, policy)
        except Exception as e:
            report = log.warning if unavailable(e) else log.error
            report("%s / %s failed (%s): %s", idem_scope, key, getattr(e, "sqlstate", None), e)
            return to_response(http.failure_answer(e, getattr(request, "idempotency", None) is not None))

    def without_key(self, request: HttpRequest, idem_scope: str, policy: RoutePolicy) -> HttpResponse:
        """required=False and no key: the view runs unprotected with the same context (no
        record); same-transaction routes in `transaction.atomic()`, rolled back when the
        answer is one that would not be stored."""
        request.idempotency = IdempotencyContext(self.client, self.alias, idem_scope, None, None, policy)  # type: ignore[attr-defined]
        if policy.mode == COMMITTED_FIRST:
            return self.get_response(request)
        response = None
        try:
            live_connection(self.alias)
            with transaction.atomic(using=self.alias):
                response = self.get_response(request)
                if not policy.stores(response.status_code):
                    transaction.set_rollback(True, using=self.alias)
            return response
        except Exception as e:
            log.error("%s without a key failed: %r", idem_scope, e, exc_info=e)
            return to_response(http.failure_answer(e, handler_ran=response is not None))

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A view that raised Refused answers its problem. A protected view that raised
        anything else answers 500 problem+json (not stored: the
        transaction rolls back, or the committed-first key is released). Any view (protected
        or not) that raised because the database could not be reached answers 503
        problem+json with Retry-After, not Django's HTML error page."""
        if isinstance(exception, Refused):  # the view's own problem answer
            return to_response(exception.answer)
        ctx = getattr(request, "idempotency", None)
        if ctx is None:
            return to_response(http.failure_answer(exception, False)) if unavailable(exception) else None
        if isinstance(exception, NotOwner):
            log.warning("%s was taken over while its view ran: its step was refused", ctx.key)
            return to_response(http.fenced_answer())
        if unavailable(exception) and ctx.point is None:
            # Same transaction: the claim's transaction did not commit; committed first: no step
            # was done. Nothing was done, so the same request can be repeated.
            log.warning("%s: the database went away while the view ran (%s); nothing was done", ctx.key, exception)
            return unavailable_response()
        log.error("view failed: %r", exception, exc_info=exception)
        return to_response(http.contract_problem("internal-error"))

    def claim(self, conn: psycopg.Connection, idem_scope: str, key: str, fingerprint: str,
              policy: RoutePolicy, token: uuid.UUID | None = None) -> Claim:
        features = self.client.features(conn)
        return self.client.claim(conn, idem_scope, key, fingerprint, ttl=policy.ttl, lease=policy.lease,
                                 wait=policy.wait if features.claim_wait else None,
                                 token=(token or uuid.uuid4()) if features.claim_token else None)

    def claim_committed(self, idem_scope: str, key: str, fingerprint: str, policy: RoutePolicy) -> Claim:
        """As asgi's: repeated once, with the same token, on a broken connection."""
        token = uuid.uuid4()
        try:
            return self.claim(live_connection(self.alias), idem_scope, key, fingerprint,
                              policy, token)
        except psycopg.OperationalError as e:
            if not (self.client.known_features and self.client.known_features.claim_token):
                raise
            log.warning("the claim of %s / %s lost its connection (%s); repeating it with its token",
                        idem_scope, key, e)
            connections[self.alias].close()
        return self.claim(raw_connection(self.alias), idem_scope, key, fingerprint, policy, token)

    def same_transaction(self, request: HttpRequest, idem_scope: str, key: str, fingerprint: str,
                         policy: RoutePolicy) -> HttpResponse:
        """The claim, the view and idem_complete in one transaction. A claim whose connection was
        lost before the view ran is sent once more on a new connection: its transaction did not
        commit (not inside the application's own transaction, which is lost with it)."""
        outermost = not connections[self.alias].in_atomic_block
        for last in (False, True):
            try:
                live_connection(self.alias)
                with transaction.atomic(using=self.alias):
                    try:
                        return self.in_transaction(request, idem_scope, key, fingerprint, policy, outermost)
                    except Exception:
                        transaction.set_rollback(True, using=self.alias)
                        forget_if_closed(self.alias)
                        raise
            except _RolledBack as r:
                return r.response
            except Exception as e:
                if last or not outermost or getattr(request, "idempotency", None) is not None or not unavailable(e):
                    raise
                log.warning("the claim of %s / %s lost its connection (%s); sending it again on another",
                            idem_scope, key, e)
                connections[self.alias].close()
        raise AssertionError("unreachable")

    def in_transaction(self, request: HttpRequest, idem_scope: str, key: str, fingerprint: str,
                       policy: RoutePolicy, outermost: bool) -> HttpResponse:
        conn = raw_connection(self.alias)
        claim = self.claim(conn, idem_scope, key, fingerprint, policy)
        if not claim.owned:
            return to_response(http.answer_without_work(claim))
        request.idempotency = IdempotencyContext(self.client, self.alias, idem_scope, key, claim, policy)  # type: ignore[attr-defined]
        with last_words(conn) as ended:
            response = self.get_response(request)
            if not policy.stores(response.status_code) or response.streaming:
                raise _RolledBack(response)
            return self.complete(conn, ended, idem_scope, key, claim, policy, response, outermost)

    def complete(self, conn: psycopg.Connection, ended: list, idem_scope: str, key: str, claim: Claim,
                 policy: RoutePolicy, response: HttpResponse, outermost: bool) -> HttpResponse:
        """idem_complete (with COMMIT when the middleware's transaction is the outermost). A session
        the server ended before it (`ended`: its last words heard between statements) or while it
        ran (57P01) did not commit: 503."""
        if ended or is_dead(conn):
            log.warning("%s / %s: the server closed the connection while the view ran; nothing was committed",
                        idem_scope, key)
            connections[self.alias].close()  # in the atomic block: leaving it then sends nothing
            raise _RolledBack(unavailable_response())
        text, stored = http.storable(policy, response.items(), response.content)
        try:
            if outermost and not connections[self.alias].needs_rollback:
                # idem_complete and COMMIT in one round trip; the atomic block's own commit then
                # finds no transaction and sends nothing (its on_commit callbacks still run).
                sent = self.client.complete_and_commit(conn, idem_scope, key, claim.token,  # type: ignore[arg-type]
                                                       response.status_code, stored, text)
            else:  # inside the application's transaction (ATOMIC_REQUESTS): that one commits
                sent = self.client.complete(conn, idem_scope, key, claim.token, response.status_code,  # type: ignore[arg-type]
                                            headers=stored, body_json=text)
        except Exception as e:
            if not (ended or ended_uncommitted(e)):
                raise
            log.warning("%s / %s: the server ended the session before the COMMIT (%s); nothing was committed",
                        idem_scope, key, e)
            connections[self.alias].close()
            raise _RolledBack(unavailable_response()) from e
        return with_stored_body(response, stored, sent)

    def committed_first(self, request: HttpRequest, idem_scope: str, key: str, fingerprint: str,
                        policy: RoutePolicy) -> HttpResponse:
        if not connections[self.alias].get_autocommit():
            raise RuntimeError("committed-first routes need autocommit (no ATOMIC_REQUESTS)")
        try:
            claim = self.claim_committed(idem_scope, key, fingerprint, policy)
        except (IdempotencyError, psycopg.Error) as e:
            log.error("the claim of %s / %s failed (%s): %s", idem_scope, key, getattr(e, "sqlstate", None), e)
            return to_response(http.contract_problem("service-unavailable"))
        conn = raw_connection(self.alias)
        if not claim.owned:
            return to_response(http.answer_without_work(claim))
        ctx = IdempotencyContext(self.client, self.alias, idem_scope, key, claim, policy)
        request.idempotency = ctx  # type: ignore[attr-defined]
        keeper = LeaseKeeper(ctx)
        keeper.start()
        try:
            response = self.get_response(request)
        finally:
            keeper.stop()
        if not policy.stores(response.status_code) or response.streaming:
            if ctx.point is None:
                self.release(idem_scope, key, claim)
            return response
        text, stored = http.storable(policy, response.items(), response.content)
        try:
            sent = self.client.complete(conn, idem_scope, key, claim.token, response.status_code,  # type: ignore[arg-type]
                                        headers=stored, body_json=text)
        except (NotOwner, NoLiveRecord) as e:
            log.warning("late completion refused for %s / %s (%s): the claim was taken over", idem_scope, key,
                        e.sqlstate)
            return to_response(http.fenced_answer())
        return with_stored_body(response, stored, sent)

    def release(self, idem_scope: str, key: str, claim: Claim) -> None:
        """Gives the key back; with the database away it stays claimed until its lease ends."""
        try:
            self.client.release(raw_connection(self.alias), idem_scope, key, claim.token)  # type: ignore[arg-type]
        except Exception as e:
            if not unavailable(e):
                raise
            log.warning("%s / %s could not be released (%s): it is free again when its lease ends",
                        idem_scope, key, e)
            connections[self.alias].close()


def with_stored_body(response: HttpResponse, stored: dict[str, str], sent: str | None) -> HttpResponse:
    """The view's response with the body as every replay will send it."""
    response.content = http.stored_answer(response.status_code, stored, sent).body
    response["Content-Length"] = str(len(response.content))
    return response
