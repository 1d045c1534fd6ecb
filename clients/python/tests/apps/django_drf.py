"""A Django app with Django REST framework views, as an application writes one, for
tests/test_application.py: DATABASE_URL=... gunicorn --chdir tests/apps django_drf:application"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

from django.conf import settings

from pg_idempotency import Refused, RoutePolicy

url = urlsplit(os.environ["DATABASE_URL"])
query = parse_qs(url.query)  # ?host=/socket/dir&port=N, as libpq reads them
settings.configure(
    DEBUG=False, ALLOWED_HOSTS=["*"], SECRET_KEY="test-only", ROOT_URLCONF=__name__, USE_TZ=True,
    # Persistent connections without Django's health checks (CONN_HEALTH_CHECKS): after a database
    # restart the middleware finds the closed ones itself (tests/test_outage.py).
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": url.path.lstrip("/"),
                           "USER": url.username, "HOST": query.get("host", [url.hostname])[0],
                           "PORT": query.get("port", [str(url.port)])[0], "CONN_MAX_AGE": 60}},
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"],
    MIDDLEWARE=["pg_idempotency.django.IdempotencyMiddleware"],
    REST_FRAMEWORK={"DEFAULT_AUTHENTICATION_CLASSES": [], "DEFAULT_PERMISSION_CLASSES": [],
                    "UNAUTHENTICATED_USER": None},
    IDEMPOTENCY={"ROUTES": {"POST /orders": RoutePolicy(), "POST /notes": RoutePolicy(required=False),
                            "POST /refusals": RoutePolicy()},
                 "TENANT": lambda request: request.headers["X-Api-Key"]},
)

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework import serializers  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.views import APIView  # noqa: E402

with connection.cursor() as cur:
    cur.execute("CREATE TABLE IF NOT EXISTS orders (tenant text, item text, quantity int)")
    cur.execute("CREATE TABLE IF NOT EXISTS notes (tenant text, text text)")
connection.close()


class OrderSerializer(serializers.Serializer):
    item = serializers.CharField()
    quantity = serializers.IntegerField(min_value=1)


class Orders(APIView):
    def post(self, request):
        order = OrderSerializer(data=request.data)
        order.is_valid(raise_exception=True)  # DRF's 400, before any write
        with connection.cursor() as cur:  # the claim's transaction (the middleware's atomic())
            cur.execute("INSERT INTO orders VALUES (%s, %s, %s)",
                        (request.headers["X-Api-Key"], order.validated_data["item"], order.validated_data["quantity"]))
        return Response(order.validated_data, status=201)


class Notes(APIView):
    def post(self, request):
        idem = request._request.idempotency  # with or without a key (required=False)
        with connection.cursor() as cur:
            cur.execute("INSERT INTO notes VALUES (%s, %s)", (request.headers["X-Api-Key"], request.data["text"]))
        return Response({"text": request.data["text"], "key": idem.key}, status=201)


def refusals(request):
    with connection.cursor() as cur:
        cur.execute("INSERT INTO notes VALUES (%s, 'written before the refusal')", (request.headers["X-Api-Key"],))
    raise Refused(status=403, title="Forbidden", detail="not your account", headers={"X-Reason": "tenant"})


def healthz(request):
    return HttpResponse("ok")


urlpatterns = [path("healthz", healthz), path("orders", Orders.as_view()), path("notes", Notes.as_view()),
               path("refusals", refusals)]
application = get_wsgi_application()
