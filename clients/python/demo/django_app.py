"""The Django demo app, one file, served by gunicorn (WSGI, threads):
    clients/python/demo/run-django --database-url URL --listen HOST:PORT"""

from __future__ import annotations

import logging
import os
import sys
import time
from urllib.parse import parse_qs, unquote, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

ARGS = None


def database_settings(url: str) -> dict:
    """Django's DATABASES entry from a libpq URL (?host=/socket/dir&port=N as libpq reads them)."""
    u = urlsplit(url)
    query = parse_qs(u.query)
    host = query.get("host", [u.hostname or ""])[0]
    port = query.get("port", [str(u.port or "")])[0]
    return {"ENGINE": "django.db.backends.postgresql", "NAME": unquote(u.path.lstrip("/")) or "postgres",
            "USER": unquote(u.username or ""), "PASSWORD": unquote(u.password or ""),
            "HOST": host, "PORT": port, "CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True}


def configure(args) -> None:
    from django.conf import settings

    settings.configure(
        DEBUG=False, ALLOWED_HOSTS=["*"], SECRET_KEY="demo-only", ROOT_URLCONF=__name__,
        DATABASES={"default": database_settings(args.database_url)},
        MIDDLEWARE=["pg_idempotency.django.IdempotencyMiddleware"],
        IDEMPOTENCY={"ROUTES": common.policies(args.lease_ms), "TENANT": tenant_of},
        INSTALLED_APPS=[], USE_TZ=True,
        LOGGING={"version": 1, "handlers": {"err": {"class": "logging.StreamHandler"}},
                 "loggers": {"pg_idempotency": {"handlers": ["err"], "level": "INFO", "propagate": False}}},
    )
    import django

    django.setup()


def tenant_of(request) -> str:
    return common.tenant_from(request.headers.get("X-Api-Key"))


def problem(r):
    from pg_idempotency.django import to_response

    return to_response(r.answer)


def created(charge_id: str, amount: int, currency: str):
    from django.http import JsonResponse

    return JsonResponse(common.charge_json(charge_id, amount, currency), status=201,
                        headers={"Location": f"/charges/{charge_id}"})


def healthz(request):
    from django.http import HttpResponse

    return HttpResponse("ok\n", content_type="text/plain")


def inject_faults(request) -> None:
    """X-Fault-Delay-Ms / X-Fault-Fail-Before, with --allow-fault-injection only."""
    delay = common.fault_delay_ms(request.headers, ARGS.allow_fault_injection)
    if delay:
        time.sleep(delay / 1000)
    if common.fault_fail_before(request.headers, ARGS.allow_fault_injection):
        raise RuntimeError("fault injected before the side effect")


def create_charge(request):
    """Same transaction: the middleware's atomic block is open; the row goes into it."""
    from django.db import connection

    from pg_idempotency import Refused

    try:
        amount, currency = common.parse_charge(request.body)
    except Refused as r:
        return problem(r)
    inject_faults(request)
    charge_id = common.new_charge_id()
    with connection.cursor() as cur:
        cur.execute(common.INSERT_CHARGE, (charge_id, request.headers["X-Api-Key"], amount, currency))
    return created(charge_id, amount, currency)


def create_external_charge(request):
    """Committed first: the charge row is written in a step fenced by its checkpoint."""
    from django.db import connection

    from pg_idempotency import Refused

    try:
        amount, currency = common.parse_charge(request.body)
    except Refused as r:
        return problem(r)
    idem = request.idempotency
    inject_faults(request)
    if idem.point == "charged":
        charge_id = idem.data["id"]
    else:
        charge_id = common.new_charge_id()
        with idem.step("charged", {"id": charge_id}), connection.cursor() as cur:
            cur.execute(common.INSERT_CHARGE, (charge_id, request.headers["X-Api-Key"], amount, currency))
    return created(charge_id, amount, currency)


def get_charge(request, charge_id):
    from django.db import connection
    from django.http import JsonResponse

    from pg_idempotency import Refused

    try:
        tenant = tenant_of(request)
    except Refused as r:
        return problem(r)
    with connection.cursor() as cur:
        cur.execute(common.SELECT_CHARGE, (charge_id, tenant))
        row = cur.fetchone()
    if row is None:
        return problem(Refused(status=404, detail="no such charge"))
    return JsonResponse(common.charge_json(*row))


def only(method, view):
    def dispatch(request, *args, **kwargs):
        if request.method != method:
            from django.http import HttpResponseNotAllowed

            return HttpResponseNotAllowed([method])
        return view(request, *args, **kwargs)

    from django.views.decorators.csrf import csrf_exempt

    return csrf_exempt(dispatch)


urlpatterns: list = []


def routes() -> list:
    from django.urls import path

    return [
        path("healthz", only("GET", healthz)),
        path("charges", only("POST", create_charge)),
        path("charges/external", only("POST", create_external_charge)),
        path("charges/<str:charge_id>", only("GET", get_charge)),
    ]


def main() -> None:
    global ARGS
    ARGS = common.parse_args("run-django")
    configure(ARGS)
    urlpatterns.extend(routes())
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(common.SCHEMA)
    connection.close()

    from django.core.wsgi import get_wsgi_application
    from gunicorn.app.base import BaseApplication

    application = get_wsgi_application()

    class Server(BaseApplication):
        def load_config(self):
            for k, v in {"bind": f"{ARGS.host}:{ARGS.port}", "workers": 1, "threads": 24,
                         "worker_class": "gthread", "timeout": 120, "loglevel": "warning",
                         "errorlog": "-"}.items():
                self.cfg.set(k, v)

        def load(self):
            return application

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    common.log(f"demo (Django) listening on {ARGS.host}:{ARGS.port}")
    Server().run()


if __name__ == "__main__":
    main()
