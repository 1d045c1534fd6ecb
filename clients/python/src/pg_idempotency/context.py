"""What a protected handler is told about its claim; the ASGI and Django contexts add
their connections and `step()`."""

from __future__ import annotations

from typing import Any

from .client import Claim, Outcome
from .http import RoutePolicy

# What lease renewals write as the recovery point while the handler has recorded none
# (idem_checkpoint requires one); contexts report it as None.
LEASE_ONLY = "lease-renewed"


class ClaimContext:
    """`point` / `data`: the last recovery point recorded (by this handler's steps, or by a
    previous owner when the claim was `reclaimed`); None when nothing was done yet.
    `lost`: a lease renewal found the claim taken over. On a route with `required=False`
    a request without a key gets a context too, with `key`, `claim`, `token` and `outcome`
    None: the same database handle (`conn` / `step()`), no record."""

    def __init__(self, scope: str, key: str | None, claim: Claim | None, policy: RoutePolicy):
        self.scope, self.key, self.claim, self.policy = scope, key, claim, policy
        self.token = claim.token if claim else None
        point = claim.recovery_point if claim else None
        self.point: str | None = None if point == LEASE_ONLY else point
        self.data: Any = claim.recovery_data if claim else None
        self.lost = False

    @property
    def outcome(self) -> Outcome | None:
        return self.claim.outcome if self.claim else None

    def renewal_point(self) -> str:
        return self.point or LEASE_ONLY
