"""Which requests are protected: route templates such as "POST /charges/{id}" mapped to a
RoutePolicy. The template (not the path) goes into the default scope."""

from __future__ import annotations

import re
from typing import Mapping

from .http import RoutePolicy


def compile_template(template: str) -> re.Pattern[str]:
    """"/charges/{id}" -> a regex where each {name} is one path segment."""
    parts = re.split(r"(\{[^}/]+\})", template)
    pattern = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
    return re.compile(pattern + r"/?\Z")


class RouteTable:
    def __init__(self, routes: Mapping[str, RoutePolicy]):
        self.entries = []
        for spec, policy in routes.items():
            method, _, template = spec.partition(" ")
            if not template.startswith("/"):
                raise ValueError(f"route {spec!r}: expected 'METHOD /path/{{param}}'")
            self.entries.append((method.upper(), template, compile_template(template), policy))

    def match(self, method: str, path: str) -> tuple[str, RoutePolicy] | None:
        """(template, policy) of the first route matching, or None."""
        for m, template, regex, policy in self.entries:
            if m == method.upper() and regex.match(path):
                return template, policy
        return None
