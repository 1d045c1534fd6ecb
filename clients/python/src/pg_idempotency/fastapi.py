"""FastAPI surfaces over the ASGI middleware: routes marked where they are declared, with a
dependency that hands the handler its context, and the tenant from a Request.

    app.add_middleware(IdempotencyMiddleware, pool=pool, routes=idempotent_routes,
                       tenant=from_request(lambda request: request.headers["x-api-key"]))

    ORDERS = Idempotent(RoutePolicy(ignore_fields=("note",)))

    @app.post("/orders", status_code=201)
    async def create_order(order: Order, idem: Annotated[AsyncIdempotencyContext, Depends(ORDERS)]):
        await idem.conn.execute(...)

The middleware still does the work (claim before the body is validated, the answer stored
after it is serialized); `idempotent_routes` reads the marked routes from the app once, at
its first request, so a route is never listed a second time as a "POST /orders" string.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from fastapi import Request

from .http import RoutePolicy


class Idempotent:
    """A dependency marking its route as protected with `policy`; its value is the route's
    context (AsyncIdempotencyContext: `conn`, `step()`, `key`, `claim`)."""

    def __init__(self, policy: RoutePolicy | None = None):
        self.policy = policy or RoutePolicy()

    def __call__(self, request: Request) -> Any:
        ctx = getattr(request.state, "idempotency", None)
        if ctx is None:
            raise RuntimeError("Idempotent(): the route was not run by pg_idempotency.asgi.IdempotencyMiddleware "
                               "(add it with routes=idempotent_routes)")
        return ctx


def _markers(dependant: Any) -> Iterator[Idempotent]:
    for dep in getattr(dependant, "dependencies", ()):
        if isinstance(dep.call, Idempotent):
            yield dep.call
        yield from _markers(dep)


def _routes(routes: Any, prefix: str = "", included: tuple[Any, ...] = ()) -> Iterator[tuple[str, Any, tuple]]:
    """(full path, route, include-time dependencies) of every route, into included routers:
    recent FastAPI keeps an included router whole (original_router, include_context) where
    older ones copied its routes into the app."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            ctx = route.include_context
            yield from _routes(inner.routes, prefix + ctx.prefix,
                               (*included, *(d.dependency for d in ctx.dependencies)))
        elif hasattr(route, "path"):
            yield prefix + route.path, route, included


def idempotent_routes(app: Any) -> dict[str, RoutePolicy]:
    """{"METHOD /path/{param}": policy} of every route of `app` with an Idempotent dependency
    (in its parameters or its `dependencies=[...]`, its router's, or include_router's)."""
    table: dict[str, RoutePolicy] = {}
    for path, route, included in _routes(getattr(app, "routes", ())):
        found = [*_markers(getattr(route, "dependant", None)), *(d for d in included if isinstance(d, Idempotent))]
        if len(found) > 1:
            raise ValueError(f"route {path}: more than one Idempotent() dependency")
        for method in sorted(getattr(route, "methods", None) or ()) if found else ():
            table[f"{method} {path}"] = found[0].policy
    return table


def from_request(tenant: Callable[[Request], str]) -> Callable[[dict[str, Any]], str]:
    """The middleware's tenant function from one that takes a Starlette/FastAPI Request
    (headers, `request.user`, `request.state` ...; not the body)."""
    return lambda scope: tenant(Request(scope))
