"""The tool-calls route's fast lane (gateway.api.tool_calls_lane) answers exactly as the
framework's route does, and hands to the framework every request it is not sure of.

Each scenario is sent to two apps on the same database: one as made by ``create_app``, one
with the lane taken out (its inner app put in its place). The lane must have taken the
request in the first, and both answers must agree: status, error code, headers, body."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import jwt
import pytest
import sqlalchemy as sa
from litestar import Litestar
from litestar.params import HeaderParameter
from litestar.testing import AsyncTestClient

from gateway.api.context import RequestContextMiddleware
from gateway.api.tool_calls_lane import ToolCallsLane
from gateway.app import create_app
from gateway.db.models import Tenant
from gateway.wiring import services_of
from tests.support import db
from tests.support.app import make_settings
from tests.support.calls import batch, tool_call
from tests.support.http import assert_error
from tests.support.tokens import auth_for, make_token

pytestmark = pytest.mark.postgres

ALICE = auth_for("alice")
BODY_LIMIT = 4096


def lane_of(app: Litestar) -> ToolCallsLane:
    context = app.asgi_handler
    assert isinstance(context, RequestContextMiddleware)
    assert isinstance(context.app, ToolCallsLane)
    return context.app


@asynccontextmanager
async def gateway(url: str, *, lane: bool, **overrides: Any) -> AsyncIterator[tuple[AsyncTestClient, Litestar]]:
    # The lane serves callers whose tenant is cached: the tests' default of no cache would
    # send every request to the framework.
    settings = make_settings(url, policy_cache_s=60.0, max_body_bytes=BODY_LIMIT, **overrides)
    app = create_app(settings)
    if not lane:
        context = app.asgi_handler
        assert isinstance(context, RequestContextMiddleware)
        context.app = lane_of(app).app
    async with AsyncTestClient(app=app) as client:
        yield client, app


async def warm(client: AsyncTestClient, headers: dict[str, str]) -> str:
    """A run of the caller's, made with the caller's token: the token and the tenant are cached."""
    response = await client.post("/v1/runs", headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def comparable(response: Any) -> tuple[int, str | None, dict[str, Any]]:
    """Status, content type and body, with what differs by request (ids, times) taken out."""
    body = response.json()
    if "error" in body:
        body["error"].pop("request_id")
        body["error"].pop("error_id", None)
    return response.status_code, response.headers.get("content-type"), body



def post(run: str, body: bytes | str, headers: dict[str, str] | None = None, suffix: str = "") -> dict[str, Any]:
    return {
        "url": f"/v1/runs/{run}/tool-calls{suffix}",
        "content": body,
        "headers": {**ALICE, "content-type": "application/json", **(headers or {})},
    }


SCENARIOS: dict[str, Callable[[str], dict[str, Any]]] = {
    "one call": lambda run: post(run, json.dumps(batch(tool_call("add", {"a": 1, "b": 2}, call_id="c1")))),
    "a mixed batch": lambda run: post(run, json.dumps(batch(
        tool_call("add", {"a": 1, "b": 2}, call_id="c1"),
        tool_call("create_article", {"title": "t", "body": "b"}, call_id="c2"),  # a member may not
        tool_call("no_such_tool", {}, call_id="c3"),
        tool_call("add", {"a": "x"}, call_id="c4"),
    ))),
    "not JSON": lambda run: post(run, b'{"tool_calls": [}'),
    "an empty body": lambda run: post(run, b""),
    "a repeated id": lambda run: post(run, json.dumps(batch(
        tool_call("add", {"a": 1, "b": 2}, call_id="same"), tool_call("add", {"a": 1, "b": 3}, call_id="same")
    ))),
    "a run that is not there": lambda run: post("run_not_there", json.dumps(batch(tool_call("add", {"a": 1, "b": 2})))),
    "a body over the limit": lambda run: post(run, b'{"tool_calls": [], "pad": "' + b"x" * BODY_LIMIT + b'"}'),
    "NUL in an id": lambda run: post(run, json.dumps(batch(tool_call("add", {"a": 1, "b": 2}, call_id="a\u0000")))),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_the_lane_answers_as_the_route_does(seeded_pg_url, name):
    answers = []
    for with_lane in (True, False):
        async with gateway(seeded_pg_url, lane=with_lane) as (client, app):
            run = await warm(client, ALICE)
            before = lane_of(app).taken if with_lane else 0
            response = await client.post(**SCENARIOS[name](run))
            if with_lane:
                assert lane_of(app).taken == before + 1, "the lane did not take the request"
            assert response.headers["x-request-id"]
            assert "server-timing" in response.headers
            assert int(response.headers["content-length"]) == len(response.content)
            answers.append(comparable(response))
    assert answers[0] == answers[1]


async def test_the_lane_answers_a_rate_limited_caller_429_with_retry_after(seeded_pg_url):
    await db.execute(seeded_pg_url, sa.text(
        "INSERT INTO rate_limit_overrides (tenant_id, scope, rate_per_s, burst) VALUES ('acme', 'user', 0.001, 4)"
    ))
    async with gateway(seeded_pg_url, lane=True) as (client, app):
        run = await warm(client, ALICE)  # one of the four
        taken = lane_of(app).taken
        statuses = []
        for n in range(5):
            response = await client.post(**post(run, json.dumps(batch(tool_call("add", {"a": n, "b": 1})))))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert_error(response, 429, "RATE_LIMITED")
                assert int(response.headers["retry-after"]) >= 1
        assert statuses == [200, 200, 200, 429, 429]
        assert lane_of(app).taken == taken + 5


@pytest.mark.parametrize(
    "request_of",
    [
        pytest.param(lambda run: post(run, b"{}", suffix="/"), id="a trailing slash"),
        pytest.param(lambda run: post(run, b"{}", suffix="?x=1"), id="a query string"),
        pytest.param(lambda run: post(run + "%2e", b"{}"), id="an id that is not an id"),
        pytest.param(lambda run: post(run, b"{}", headers={"authorization": ""}), id="no token"),
        pytest.param(lambda run: post(run, b"{}", headers={"authorization": "Basic eDp5"}), id="not a bearer token"),
        pytest.param(lambda run: post(run, b"{}", headers=auth_for("bob")), id="a token not seen before"),
        pytest.param(lambda run: post(run, b"{}", headers={"authorization": "Bearer x.y.z"}), id="a bad token"),
        pytest.param(lambda run: post(run, b"{}", headers={"content-length": "x"}), id="a length that is no number"),
    ],
)
async def test_what_the_lane_is_not_sure_of_goes_to_the_framework(seeded_pg_url, request_of):
    async with gateway(seeded_pg_url, lane=True) as (client, app):
        run = await warm(client, ALICE)
        taken = lane_of(app).taken
        await client.post(**request_of(run))
        assert lane_of(app).taken == taken


async def test_a_tenant_disabled_after_its_caller_was_cached_is_refused(seeded_pg_url):
    async with gateway(seeded_pg_url, lane=True) as (client, app):
        run = await warm(client, ALICE)
        await db.execute(seeded_pg_url, sa.update(Tenant).where(Tenant.id == "acme").values(disabled=True))
        services_of(app).tenant_directory.invalidate("acme")  # what the cache's expiry does, without the wait
        again = await client.get(f"/v1/runs/{run}", headers=ALICE)  # the framework's path loads it, disabled
        assert_error(again, 403, "TENANT_DISABLED")
        taken = lane_of(app).taken
        response = await client.post(**post(run, json.dumps(batch(tool_call("add", {"a": 1, "b": 2})))))
        assert_error(response, 403, "TENANT_DISABLED")
        assert lane_of(app).taken == taken


async def test_an_expired_token_is_not_taken_from_the_cache(seeded_pg_url):
    async with gateway(seeded_pg_url, lane=True) as (client, app):
        token = make_token("acme", "alice", ttl=5)
        expires = jwt.decode(token, options={"verify_signature": False})["exp"]
        headers = {"authorization": f"Bearer {token}"}
        run = await warm(client, headers)
        assert services_of(app).token_verifier.cached(token) is not None  # the lane could take it now
        taken = lane_of(app).taken
        await asyncio.sleep(max(0.0, expires - time.time()) + 0.5)
        response = await client.post(**post(run, json.dumps(batch(tool_call("add", {"a": 1, "b": 2}))), headers))
        assert_error(response, 401, "UNAUTHENTICATED")
        assert lane_of(app).taken == taken


async def test_a_host_the_framework_refuses_goes_to_the_framework(seeded_pg_url):
    async with gateway(seeded_pg_url, lane=True) as (client, app):
        run = await warm(client, ALICE)
        taken = lane_of(app).taken
        request = post(run, json.dumps(batch(tool_call("add", {"a": 1, "b": 2}))), headers={"host": 'a/b"<c>'})
        response = await client.post(**request)
        assert_error(response, 400, "INVALID_REQUEST")
        assert lane_of(app).taken == taken
        assert await db.audit_rows(seeded_pg_url, run_id=run, kind="tool_call") == []


class Recorder:
    """An inner app that only notes that it was called."""

    def __init__(self) -> None:
        self.called = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called += 1


def plain_scope(**changes: Any) -> dict[str, Any]:
    scope = {
        "type": "http", "method": "POST", "path": "/v1/runs/run_1/tool-calls", "query_string": b"",
        "root_path": "", "headers": [(b"host", b"x"), (b"authorization", b"Bearer t")], "state": {},
    }
    scope.update(changes)
    return scope


@pytest.mark.parametrize(
    "scope",
    [
        pytest.param(plain_scope(services=False), id="no services yet (before the lifespan, or after it)"),
        pytest.param(plain_scope(root_path="/api"), id="a root path (the framework strips it before routing)"),
        pytest.param(plain_scope(headers=[(b"Content-Length", b"-1")]), id="a negative length"),
        pytest.param(plain_scope(headers=[(b"Content-Length", b"ten")]), id="a length named in capitals"),
        pytest.param(plain_scope(type="websocket"), id="a websocket"),
        pytest.param(plain_scope(method="PUT"), id="another method"),
    ],
)
async def test_the_lane_steps_aside_before_touching_anything(scope):
    from gateway.wiring import ServicesSlot

    app = create_app(make_settings("postgresql+asyncpg://nobody@127.0.0.1:1/none"))
    inner = Recorder()
    slot = ServicesSlot()
    if scope.pop("services", True):
        # Not real services: a lane that went on past its checks would fail on them at once.
        slot.install(object())  # type: ignore[arg-type]
    lane = ToolCallsLane(inner, litestar=app, services=slot, handlers={}, max_body_bytes=10)

    async def nothing() -> Any:
        raise AssertionError("the lane read the body")

    async def no_send(message: Any) -> None:
        raise AssertionError("the lane answered")

    await lane(scope, nothing, no_send)
    assert inner.called == 1
    assert lane.taken == 0


def a_guard(connection: Any, handler: Any) -> None:
    """A guard the route might one day be given."""


async def an_after_request(response: Any) -> Any:
    return response


async def an_after_exception(exc: Exception, scope: Any) -> None:
    """A hook the app might one day be given."""


@pytest.mark.parametrize(
    ("layer", "named"),
    [
        pytest.param({"guards": [a_guard]}, "guards", id="a guard"),
        pytest.param({"after_request": an_after_request}, "after_request", id="an after-request hook"),
        pytest.param({"response_headers": {"x-extra": "1"}}, "response_headers", id="a response header"),
        pytest.param({"middleware_extra": True}, "middleware", id="another middleware"),
        pytest.param({"auth_exclude": True}, "excluded from authentication", id="the route excluded from auth"),
        pytest.param({"parameters": {"hint": HeaderParameter(name="x-hint", required=True)}},
                     "layered parameters", id="a required header for every route"),
        pytest.param({"after_exception": [an_after_exception]}, "after_exception", id="an after-exception hook"),
    ],
)
def test_an_app_whose_route_has_a_step_the_lane_skips_does_not_start(layer, named):
    from litestar.middleware.base import DefineMiddleware
    from litestar.middleware.logging import LoggingMiddlewareConfig

    from gateway.api.dependencies import service_providers
    from gateway.api.errors import exception_handlers
    from gateway.observability.metrics import Metrics
    from gateway.api.runs import RunController
    from gateway.api.tool_calls_lane import LaneMismatch
    from gateway.auth.middleware import JWTAuthenticationMiddleware
    from gateway.wiring import ServicesSlot

    slot = ServicesSlot()
    options = dict(layer)
    extra = [LoggingMiddlewareConfig().middleware] if options.pop("middleware_extra", False) else []
    exclude = [r"^/v1/runs"] if options.pop("auth_exclude", False) else []

    def app_with(*more_middleware: Any, **more: Any) -> Litestar:
        return Litestar(
            route_handlers=[RunController],
            middleware=[
                DefineMiddleware(JWTAuthenticationMiddleware, services=slot,
                                 **({"exclude": excluded} if (excluded := more.pop("exclude", [])) else {})),
                *more_middleware,
            ],
            dependencies=service_providers(slot), request_max_body_size=1000, logging_config=None,
            exception_handlers=exception_handlers(Metrics()), **more,
        )

    assert ToolCallsLane.in_front_of(app_with(), services=slot, rate_limited=False)  # as made: no step skipped
    with pytest.raises(LaneMismatch, match=named):
        ToolCallsLane.in_front_of(app_with(*extra, exclude=exclude, **options), services=slot, rate_limited=False)
