"""What the FastAPI and Django demo apps share: options, the charges table, request
validation and the charge's JSON (issue 17's demo-app contract: the same routes in every
client package, so one black-box suite, tests/e2e/run.py --app-cmd, tests them all)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from datetime import timedelta
from typing import Any

from pg_idempotency import COMMITTED_FIRST, Refused, RoutePolicy

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id text PRIMARY KEY, tenant text NOT NULL, amount bigint NOT NULL CHECK (amount > 0),
    currency text NOT NULL, gateway_charge_id text UNIQUE, created_at timestamptz NOT NULL DEFAULT now())"""

INSERT_CHARGE = "INSERT INTO charges (id, tenant, amount, currency) VALUES (%s, %s, %s, %s)"
SELECT_CHARGE = "SELECT id, amount, currency FROM charges WHERE id = %s AND tenant = %s"


def parse_args(prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="Idempotency demo app (POST /charges, /charges/external)")
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    p.add_argument("--listen", default=os.environ.get("LISTEN_ADDR"), help="HOST:PORT")
    p.add_argument("--lease-ms", type=int, default=10000)
    p.add_argument("--allow-fault-injection", action="store_true")
    args = p.parse_args()
    if not args.database_url:
        p.error("--database-url (or DATABASE_URL) is required")
    host, sep, port = (args.listen or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        p.error("--listen (or LISTEN_ADDR) HOST:PORT is required")
    if args.lease_ms <= 0:
        p.error("--lease-ms must be positive")
    args.host, args.port = host, int(port)
    return args


def policies(lease_ms: int) -> dict[str, RoutePolicy]:
    lease = timedelta(milliseconds=lease_ms)
    return {"POST /charges": RoutePolicy(lease=lease),
            "POST /charges/external": RoutePolicy(mode=COMMITTED_FIRST, lease=lease)}


def tenant_from(api_key: str | None) -> str:
    if not api_key:
        raise Refused(status=401, title="Unauthorized", detail="the X-Api-Key header (your tenant) is required",
                      headers={"WWW-Authenticate": 'ApiKey realm="charges"'})
    return api_key


def parse_charge(body: bytes) -> tuple[int, str]:
    """(amount, currency) from {"amount": int > 0, "currency": str}; raises Refused(400)."""
    try:
        data = json.loads(body)
    except ValueError:
        raise Refused(status=400, detail="the body must be JSON") from None
    ok = (isinstance(data, dict) and set(data) == {"amount", "currency"}
          and type(data["amount"]) is int and data["amount"] > 0
          and isinstance(data["currency"], str) and 0 < len(data["currency"]) <= 16)
    if not ok:
        raise Refused(status=400, detail='the body must be {"amount": <integer > 0>, "currency": <string>}')
    return data["amount"], data["currency"]


def new_charge_id() -> str:
    return "ch_" + uuid.uuid4().hex


def charge_json(charge_id: str, amount: int, currency: str) -> dict[str, Any]:
    return {"id": charge_id, "object": "charge", "amount": amount, "currency": currency, "status": "succeeded"}


def fault_delay_ms(headers: Any, allowed: bool) -> int:
    value = headers.get("x-fault-delay-ms") if allowed else None
    return int(value) if value and value.isdigit() else 0


def fault_fail_before(headers: Any, allowed: bool) -> bool:
    return bool(allowed and headers.get("x-fault-fail-before") == "1")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
