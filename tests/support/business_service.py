"""A small business service for tests and benchmarks, called by the gateway's HTTP tools.

It behaves like an internal service should behind the gateway:
- it trusts only the gateway's token, verified with the gateway's JWKS (fetched from its
  URL, cached, refetched for an unknown key id), for its own audience;
- it enforces its own rules: orders belong to a tenant and an owner (another tenant's
  order is 404, another user's is 403 unless the caller is an editor), a cancelled order
  cannot be cancelled again (409), quantities above 100 are refused (422);
- it honours ``Idempotency-Key``: a repeated key returns the stored answer and applies nothing;
- it has endpoints that answer any status, sleep, redirect, and send oversized or endless
  bodies, and it records every request as it arrived (raw path, query, headers).

    uvicorn tests.support.business_service:app_from_env --factory   # BUSINESS_JWKS_URL=...
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.response import Redirect, Stream
from litestar.types import ASGIApp, Receive, Scope, Send


class Unauthorized(Exception):
    pass


class GatewayKeys:
    """The gateway's public keys, from its JWKS URL."""

    def __init__(self, jwks_url: str) -> None:
        self._url = jwks_url
        self._keys: dict[str, jwt.PyJWK] = {}
        self._lock = asyncio.Lock()

    async def key(self, kid: str) -> jwt.PyJWK:
        if kid not in self._keys:
            async with self._lock:
                if kid not in self._keys:
                    async with httpx.AsyncClient(timeout=5.0) as client:
                        response = await client.get(self._url)
                    response.raise_for_status()
                    keyset = jwt.PyJWKSet.from_dict(response.json())
                    self._keys = {key.key_id: key for key in keyset.keys if key.key_id}
        try:
            return self._keys[kid]
        except KeyError:
            raise Unauthorized("unknown key id") from None


@dataclass
class SeenRequest:
    method: str
    raw_path: str
    query: str
    headers: dict[str, str]


@dataclass
class ServiceState:
    audience: str
    issuer: str
    keys: GatewayKeys
    record: bool = True
    """Keep every request and token seen (tests); a benchmark turns it off."""
    orders: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    idempotent: dict[tuple[str, str], tuple[int, dict[str, Any]]] = field(default_factory=dict)
    seen: list[SeenRequest] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    applied_changes: int = 0
    endless_bytes_sent: int = 0
    next_id: int = 0
    echo_work_s: float = 0.0
    """How long the echo endpoint works before answering, as a real service would."""


async def caller(request: Request) -> dict[str, Any]:
    """The verified claims of the gateway's token: the only source of identity here."""
    service: ServiceState = request.app.state.service
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("no token")
    try:
        header = jwt.get_unverified_header(token)
        key = await service.keys.key(str(header.get("kid")))
        claims = jwt.decode(
            token,
            key.key,
            algorithms=["ES256", "RS256"],
            audience=service.audience,
            issuer=service.issuer,
            options={"require": ["exp", "iat", "sub", "aud", "iss"]},
        )
    except jwt.PyJWTError:
        raise Unauthorized("invalid token") from None
    if service.record:
        service.claims.append(claims)
    return claims


def problem(status: int, detail: str, **extra: Any) -> Response[dict[str, Any]]:
    return Response({"detail": detail, **extra}, status_code=status)


def unauthorized(request: Request, exc: Unauthorized) -> Response[dict[str, Any]]:
    return problem(401, "The token was not accepted.", reason=str(exc))


@get("/api/whoami")
async def whoami(request: Request) -> Response[dict[str, Any]]:
    claims = await caller(request)
    # A session cookie for this user: a client shared by many users must not send it back.
    cookie = f"session={claims['sub']}; Path=/; HttpOnly"
    return Response(headers={"set-cookie": cookie}, content={
        "sub": claims["sub"],
        "tenant_id": claims["tenant_id"],
        "roles": claims["roles"],
        "run_id": claims["run_id"],
        "tool_call_id": claims["tool_call_id"],
        "aud": claims["aud"],
        "request_id": request.headers.get("x-request-id"),
    })


def _visible_order(service: ServiceState, claims: dict[str, Any], order_id: str) -> dict[str, Any] | Response:
    order = service.orders.get((claims["tenant_id"], order_id))
    if order is None:
        return problem(404, f"No order {order_id} here.")
    if order["owner"] != claims["sub"] and "editor" not in claims["roles"]:
        return problem(403, "Only the owner or an editor may see this order.")
    return order


@get("/api/orders/{order_id:str}")
async def get_order(request: Request, order_id: FromPath[str]) -> Any:
    claims = await caller(request)
    return _visible_order(request.app.state.service, claims, order_id)


class NewOrder(msgspec.Struct, forbid_unknown_fields=True):
    item: str
    quantity: int
    payment_token: str | None = None


@dataclass
class _Change:
    """A request that changes an order: who asks, and the idempotency key it may carry."""

    claims: dict[str, Any]
    service: ServiceState
    key: str | None

    @classmethod
    async def of(cls, request: Request) -> _Change:
        return cls(await caller(request), request.app.state.service, request.headers.get("idempotency-key"))

    def replayed(self) -> Response | None:
        """The answer given before to this key, if any."""
        stored = None if self.key is None else self.service.idempotent.get((self.claims["tenant_id"], self.key))
        if stored is None:
            return None
        status, body = stored
        return Response(body, status_code=status, headers={"idempotent-replayed": "true"})

    def applied(self, status: int, remembered: dict[str, Any]) -> None:
        """The change is made: count it, and keep its answer for a retry with the same key."""
        self.service.applied_changes += 1
        if self.key is not None:
            self.service.idempotent[(self.claims["tenant_id"], self.key)] = (status, remembered)


@post("/api/orders")
async def create_order(request: Request, data: JSONBody[NewOrder]) -> Any:
    change = await _Change.of(request)
    if (replay := change.replayed()) is not None:
        return replay
    if data.quantity > 100:
        return problem(422, "A single order may hold at most 100 items.")
    claims, service = change.claims, change.service
    service.next_id += 1
    order = {
        "id": f"ord_{service.next_id}",
        "tenant_id": claims["tenant_id"],
        "owner": claims["sub"],
        "item": data.item,
        "quantity": data.quantity,
        "status": "open",
    }
    service.orders[(claims["tenant_id"], order["id"])] = order
    change.applied(201, order)
    return Response(order, status_code=201)


@post("/api/orders/{order_id:str}/cancel")
async def cancel_order(request: Request, order_id: FromPath[str]) -> Any:
    change = await _Change.of(request)
    if (replay := change.replayed()) is not None:
        return replay
    order = _visible_order(change.service, change.claims, order_id)
    if isinstance(order, Response):
        return order
    if order["status"] == "cancelled":
        return problem(409, "This order is already cancelled.")
    order["status"] = "cancelled"
    change.applied(200, dict(order))
    return Response(order, status_code=200)


@get("/api/status/{code:int}")
async def any_status(request: Request, code: FromPath[int]) -> Response[dict[str, Any]]:
    await caller(request)
    headers = {"retry-after": "7"} if code == 429 else None
    return Response(
        {"detail": f"The service answered {code}.", "internal": "Traceback: db at 10.0.0.7, password=hunter2"},
        status_code=code,
        headers=headers,
    )


@get("/api/check-card")
async def check_card(request: Request, card_number: FromQuery[str], code: FromQuery[int] = 422) -> Response[dict[str, Any]]:
    """Refuses any card, quoting the input back, as validation frameworks do."""
    await caller(request)
    return Response(
        {"detail": f"Card {card_number} was refused.",
         "errors": [{"loc": ["query", "card_number"], "input": card_number}]},
        status_code=code,
    )


@get("/api/slow")
async def slow(request: Request, ms: FromQuery[int] = 0) -> dict[str, int]:
    await caller(request)
    await asyncio.sleep(ms / 1000)
    return {"slept_ms": ms}


@get("/api/big")
async def big(request: Request, size: FromQuery[int] = 0) -> Response[bytes]:
    await caller(request)
    body = b'"' + b"x" * max(size - 2, 0) + b'"'
    return Response(body, media_type="application/json")


@get("/api/endless")
async def endless(request: Request) -> Stream:
    await caller(request)
    service: ServiceState = request.app.state.service
    chunk = b"y" * 16_384

    async def forever() -> AsyncIterator[bytes]:
        while True:
            service.endless_bytes_sent += len(chunk)
            yield chunk
            await asyncio.sleep(0)

    return Stream(forever(), media_type="text/plain")


@get("/api/echo/{value:str}")
async def echo(request: Request, value: FromPath[str], q: FromQuery[str | None] = None) -> dict[str, Any]:
    await caller(request)
    work_s = request.app.state.service.echo_work_s
    if work_s:
        await asyncio.sleep(work_s)  # what a real service spends on its own work (a query, a call)
    return {"value": value, "q": q}


@get("/api/redirect", status_code=302)
async def redirect(request: Request, to: FromQuery[str]) -> Redirect:
    await caller(request)
    return Redirect(path=to)


def recording(app: ASGIApp, service: ServiceState) -> ASGIApp:
    """Records each request exactly as it arrived, before any routing or decoding."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and service.record:
            service.seen.append(
                SeenRequest(
                    method=scope["method"],
                    raw_path=scope.get("raw_path", b"").decode("latin-1"),
                    query=scope.get("query_string", b"").decode("latin-1"),
                    headers={k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
                )
            )
        await app(scope, receive, send)

    return middleware


def create_business_service(
    *, jwks_url: str, audience: str = "orders", issuer: str = "gateway", record: bool = True, echo_work_ms: int = 0
) -> Litestar:
    service = ServiceState(
        audience=audience, issuer=issuer, keys=GatewayKeys(jwks_url), record=record, echo_work_s=echo_work_ms / 1000
    )
    app = Litestar(
        route_handlers=[whoami, get_order, create_order, cancel_order, any_status, check_card, slow, big, endless, echo,
                        redirect],
        exception_handlers={Unauthorized: unauthorized},  # type: ignore[dict-item]
        state=State({"service": service}),
        logging_config=None,
        openapi_config=None,
    )
    app.asgi_handler = recording(app.asgi_handler, service)
    return app


def service_state(app: Litestar) -> ServiceState:
    return app.state.service


def app_from_env() -> Litestar:
    return create_business_service(
        jwks_url=os.environ["BUSINESS_JWKS_URL"],
        audience=os.environ.get("BUSINESS_AUDIENCE", "orders"),
        issuer=os.environ.get("BUSINESS_ISSUER", "gateway"),
        record=os.environ.get("BUSINESS_RECORD", "0") == "1",
        echo_work_ms=int(os.environ.get("BUSINESS_ECHO_WORK_MS", "0")),
    )
