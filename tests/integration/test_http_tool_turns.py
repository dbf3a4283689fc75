"""Calls of HTTP tools take turns per tenant: one tenant's calls to a slow service hold at
most GATEWAY_TOOL_MAX_REMOTE_CALLS_PER_TENANT of the services' connections, and another
tenant's call goes on meanwhile. The gateway and a business service, real servers on
loopback ports, with a pool of four connections (three for one service: each tenant's two
turns leave another tenant one of them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.integration.http_env import Caller, HttpEnv, http_env
from tests.support.calls import set_policy

POOL = 4
TURNS = 2


@pytest.fixture(scope="module")
def env(request: pytest.FixtureRequest) -> Iterator[HttpEnv]:
    yield from http_env(request, http_max_connections=POOL, tool_max_remote_calls_per_tenant=TURNS)


@pytest.fixture
async def gw(env: HttpEnv) -> AsyncIterator[Caller]:
    async with httpx.AsyncClient(base_url=env.gateway_url, timeout=30) as client:
        yield Caller(client)


async def test_one_tenants_calls_to_a_slow_service_leave_other_tenants_a_connection(env: HttpEnv, gw: Caller):
    await set_policy(gw.client, "slow", {"timeout_s": 5})  # acme's slow calls hold their connection 3 s
    held = [asyncio.create_task(gw.call("slow", {"ms": 3000})) for _ in range(POOL + 1)]
    await asyncio.sleep(0.5)
    other = await gw.call("whoami", {}, user="bob", tenant="globex")
    assert other["ok"] is True and not any(call.done() for call in held)
    outcomes = [await call for call in held]
    # Two at a time: the first two answer after 3 s; the other three, waiting their turn, reach
    # their 5 s first.
    assert sorted("ok" if o["ok"] else o["error"]["code"] for o in outcomes) == [
        "TOOL_TIMEOUT", "TOOL_TIMEOUT", "TOOL_TIMEOUT", "ok", "ok"]
