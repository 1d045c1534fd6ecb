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
    `lost`: a lease renewal found the claim taken over."""

    def __init__(self, scope: str, key: str, claim: Claim, policy: RoutePolicy):
        self.scope, self.key, self.claim, self.policy = scope, key, claim, policy
        self.token = claim.token
        self.point: str | None = None if claim.recovery_point == LEASE_ONLY else claim.recovery_point
        self.data: Any = claim.recovery_data
        self.lost = False

    @property
    def outcome(self) -> Outcome:
        return self.claim.outcome

    def renewal_point(self) -> str:
        return self.point or LEASE_ONLY
