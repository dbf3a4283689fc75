"""MCP upstreams that try to hold the gateway: a server that forgets the session, then hangs the
next ``initialize`` and drips its answer to the session's DELETE (``tests.support.hostile_mcp``),
and a tool slower than the listing timeout. The session on its own, and the gateway end to end
(create_app under uvicorn, over a real PostgreSQL), all on loopback ports."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import pytest
import structlog

from gateway.app import create_app
from gateway.mcp.upstream.config import parse_mcp_servers
from gateway.mcp.upstream.session import SessionUnavailable, UpstreamSession
from gateway.mcp.upstream.transport import CURRENT_CALL, MAX_REOPENS_PER_CALL, CallScope, upstream_client
from tests.conftest import _admin
from tests.integration.http_env import Caller, seed_with_grants
from tests.support.app import make_settings
from tests.support.hostile_mcp import TOOLS, HostileMcp
from tests.support.loopback import ServerThread, loopback_socket
from tests.support.logs import CapturedLogs
from tests.support.mcp_upstream import McpUpstream, UpstreamState
from tests.support.tokens import SERVICE_SIGNING_KEY, auth_for

BOUND_S = 10.0
"""Far less than the hostile server holds a request (its DELETE answer alone takes days), far
more than any timeout configured here."""
WAIT_S = 20.0

TOOLS_TOML = """
[mcp_servers.hostile]
url = "{hostile_url}"
include = ["echo", "wait", "huge", "shape", "redos", "forget"]

[mcp_servers.hostile.tools.echo]
name = "hostile_echo"
permission = "notes:read"
timeout_s = 1.5

[mcp_servers.hostile.tools.wait]
name = "hostile_wait"
permission = "notes:read"
timeout_s = 8

[mcp_servers.hostile.tools.huge]
name = "hostile_huge"
permission = "notes:read"

[mcp_servers.hostile.tools.shape]
name = "hostile_shape"
permission = "notes:read"

[mcp_servers.hostile.tools.redos]
name = "hostile_redos"
permission = "notes:read"

[mcp_servers.hostile.tools.forget]
name = "hostile_forget"
permission = "notes:read"

[mcp_servers.notes]
url = "{notes_url}"
include = ["whoami"]

[mcp_servers.notes.tools.whoami]
name = "notes_whoami"
permission = "notes:read"
"""

LIST_TIMEOUT_S = 2.0
POOL = 3
"""Connections of each MCP server's pool."""
TURNS = 2
"""Calls of remote tools one tenant has in flight at once."""
GRANTS = {role: frozenset({"notes:read"}) for role in ("member", "editor", "admin")}


async def ends_within(seconds: float, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """``work`` as a task, once it ended: waiting needs no cancellation, which the code under test might swallow."""
    task = asyncio.create_task(work)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    assert done, f"still running after {seconds} s"
    return task


async def eventually(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.05)


# The session on its own.


@pytest.fixture
def hostile() -> Iterator[HostileMcp]:
    with HostileMcp() as server:
        yield server


@asynccontextmanager
async def session_for(
    url: str, *, open_timeout_s: float, client_timeout_s: float = 5
) -> AsyncIterator[UpstreamSession]:
    (spec,) = parse_mcp_servers(
        {"hostile": {"url": url, "include": ["echo"], "tools": {"echo": {"permission": "notes:read"}}}},
        where="test", default_timeout_s=5, default_max_result_bytes=1000, taken=set(),
    )
    client = upstream_client(gateway_authorization=lambda aud: "Bearer the-gateway", timeout_s=client_timeout_s,
                             connect_timeout_s=1, max_connections=8, max_keepalive_connections=2)
    upstream_session = UpstreamSession(spec, client, open_timeout_s=open_timeout_s)
    try:
        yield upstream_session
    finally:
        await (await ends_within(BOUND_S, upstream_session.close()))
        await client.aclose()


async def test_a_caller_cancelled_while_a_session_opens_is_cancelled_at_once_and_holds_nobody(hostile: HostileMcp):
    hostile.mode = "forget_then_hang"
    async with session_for(hostile.url, open_timeout_s=30) as upstream_session:
        async def open_under_a_deadline() -> None:
            async with asyncio.timeout(0.5):
                await upstream_session.session()

        with pytest.raises(TimeoutError):  # the caller's own deadline, not swallowed
            await (await ends_within(BOUND_S, open_under_a_deadline()))
        hostile.mode = "normal"
        listed = await (await ends_within(BOUND_S, upstream_session.list_tools()))
    assert {tool.name for tool in listed} == {tool["name"] for tool in TOOLS}


async def test_a_session_that_hangs_initialize_and_drips_its_delete_is_unavailable_within_the_open_timeout(
    hostile: HostileMcp,
):
    hostile.mode = "forget_then_hang"
    async with session_for(hostile.url, open_timeout_s=1) as upstream_session:
        with pytest.raises(SessionUnavailable):
            await (await ends_within(BOUND_S, upstream_session.list_tools()))
        assert "initialize" in hostile.seen
        hostile.mode = "normal"
        listed = await (await ends_within(BOUND_S, upstream_session.list_tools()))
    assert {tool.name for tool in listed} == {tool["name"] for tool in TOOLS}


async def test_a_call_reads_its_answer_for_as_long_as_its_own_timeout_not_the_clients(hostile: HostileMcp):
    async with session_for(hostile.url, open_timeout_s=5, client_timeout_s=1) as upstream_session:
        token = CURRENT_CALL.set(CallScope(authorization="Bearer alice", response_limit=100_000, timeout_s=6))
        try:
            session = await upstream_session.session()
            result = await session.call_tool("wait", {"ms": 2000}, read_timeout_seconds=6)
        finally:
            CURRENT_CALL.reset(token)
    assert result.content[0].text == "waited"


async def test_a_session_opens_no_event_stream_of_its_own_so_retry_zero_cannot_loop_it(hostile: HostileMcp):
    """A review's reproduction: the SDK keeps an event stream open for messages the server
    sends on its own, and reconnects each time the server ends it; with ``retry: 0`` that was
    700–900 GETs a second, with the gateway's token, for as long as the session lived."""
    hostile.mode = "retry_zero"
    async with session_for(hostile.url, open_timeout_s=5) as upstream_session:
        await (await ends_within(BOUND_S, upstream_session.list_tools()))
        await asyncio.sleep(2.5)  # the SDK's reconnections, were any made, would all be within this
        assert hostile.seen.count("GET") == 0 and "tools/list" in hostile.seen


# The gateway, end to end.


@dataclass
class Env:
    gateway_url: str
    hostile: HostileMcp
    notes: UpstreamState


@pytest.fixture(scope="module")
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    postgres = request.getfixturevalue("postgres")
    template = request.getfixturevalue("pg_template")
    name = f"gw_mcp_hostile_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    logs = CapturedLogs()
    logs.install()
    try:
        database_url = postgres.sqlalchemy_url(name)
        asyncio.run(seed_with_grants(database_url, GRANTS))
        gateway_sock = loopback_socket()
        jwks_url = f"http://127.0.0.1:{gateway_sock.getsockname()[1]}/.well-known/jwks.json"
        notes_state = UpstreamState(jwks_url=jwks_url, audience="notes")
        tools_file = request.getfixturevalue("tmp_path_factory").mktemp("mcp") / "tools.toml"
        with HostileMcp() as hostile, McpUpstream(notes_state) as notes:
            tools_file.write_text(TOOLS_TOML.format(hostile_url=hostile.url, notes_url=notes.url))
            settings = make_settings(
                database_url,
                tools_file=str(tools_file),
                service_signing_key=SERVICE_SIGNING_KEY,
                mcp_refresh_s=0.5,
                mcp_list_timeout_s=LIST_TIMEOUT_S,
                http_max_connections=POOL,
                tool_max_remote_calls_per_tenant=TURNS,
            )
            with ServerThread(create_app(settings), gateway_sock) as gateway:
                yield Env(gateway_url=gateway.url, hostile=hostile, notes=notes_state)
    finally:
        structlog.reset_defaults()
        _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def gw(env: Env) -> AsyncIterator[Caller]:
    async with httpx.AsyncClient(base_url=env.gateway_url, timeout=60) as client:
        yield Caller(client)


async def hostile_served(gw: Caller) -> bool:
    readiness = (await gw.client.get("/readyz")).json()
    tools = (await gw.client.get("/v1/tools", headers=auth_for("alice"))).json()["tools"]
    return (not any(p["component"] == "mcp_server:hostile" for p in readiness.get("degraded", []))
            and any(t["function"]["name"] == "hostile_echo" for t in tools))


async def test_structured_content_holding_a_number_no_float_holds_is_passed_as_its_text_never_changed(
    env: Env, gw: Caller
):
    # 1e400 is read as infinity, which an encoder writes back as null: the value would change.
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    with_text = await gw.call("hostile_huge", {"with_text": True})
    assert (with_text["ok"], with_text["result"]) == (True, '{"amount": 1e400, "id": 7}')
    without = await gw.call("hostile_huge", {"with_text": False})
    assert without["ok"] is False and without["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert "number JSON cannot hold" in without["error"]["message"]


async def test_a_tool_slower_than_the_list_timeout_answers_within_its_own_timeout(env: Env, gw: Caller):
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    result = await gw.call("hostile_wait", {"ms": int(LIST_TIMEOUT_S * 1000) + 1500})
    assert result["ok"] is True, result
    assert result["result"] == "waited"


async def test_an_upstream_that_forgets_the_session_then_hangs_holds_no_call_past_its_timeout_nor_any_other(
    env: Env, gw: Caller
):
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    assert (await gw.call("hostile_echo", {"text": "before"}))["result"] == "before"

    env.hostile.mode = "forget_then_hang"
    try:
        call = await ends_within(BOUND_S, gw.call("hostile_echo", {"text": "held"}))
        assert call.result()["error"]["code"] == "TOOL_TIMEOUT", call.result()

        listings = env.notes.methods.count("tools/list")

        async def others_refreshed() -> bool:
            return env.notes.methods.count("tools/list") >= listings + 2

        await eventually(others_refreshed, "the other server is still listed while this one hangs")

        async def named_unavailable() -> bool:
            readiness = (await gw.client.get("/readyz")).json()
            return any(p["component"] == "mcp_server:hostile" for p in readiness.get("degraded", []))

        await eventually(named_unavailable, "/readyz names the hanging server")
    finally:
        env.hostile.mode = "normal"

    await eventually(lambda: hostile_served(gw), "the server's tools are back once it behaves")
    other_tenant = await gw.call("hostile_echo", {"text": "after"}, user="bob", tenant="globex")
    assert other_tenant["ok"] is True and other_tenant["result"] == "after", other_tenant


async def test_one_calls_answer_its_schema_refuses_fails_that_call_only_and_listings_carry_the_gateways_token(
    env: Env, gw: Caller
):
    """A review's reproduction: one tenant's call answered with structured content its output
    schema refuses dropped the session every tenant's calls share (another tenant's call in
    flight failed), and the session opened next listed the tools with the caller's token."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    waiting = asyncio.create_task(gw.call("hostile_wait", {"ms": 1500}, tenant="globex"))
    await asyncio.sleep(0.3)
    refused = await gw.call("hostile_shape", {})
    assert refused["ok"] is False and refused["error"]["code"] == "TOOL_EXECUTION_FAILED", refused
    assert (await waiting)["result"] == "waited"

    for method, authorization in env.hostile.authorizations:
        if method in ("initialize", "tools/list"):
            claims = jwt.decode(authorization.removeprefix("Bearer "), options={"verify_signature": False})
            assert (claims["sub"], claims["tenant_id"]) == ("gateway", ""), (method, claims)


async def test_an_output_schema_pattern_that_backtracks_is_checked_in_linear_time_off_nobodys_loop(
    env: Env, gw: Caller
):
    """A review's reproduction: the SDK checked a structured answer against the listed output
    schema with Python's backtracking `re` on the event loop; `^(a+)+$` against 48 a's and a
    `!` held every tenant's requests for days (tests/unit/test_mcp_output_check.py shows the
    check is linear; here, with 20 a's, that the answer is still refused and nobody waits)."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    waiting = asyncio.create_task(gw.call("hostile_wait", {"ms": 500}, tenant="globex"))
    refused = await (await ends_within(BOUND_S, gw.call("hostile_redos", {})))
    assert refused["ok"] is False and refused["error"]["code"] == "TOOL_EXECUTION_FAILED", refused
    assert (await waiting)["result"] == "waited"


async def test_a_session_one_call_finds_forgotten_ends_after_the_calls_in_flight_on_it(env: Env, gw: Caller):
    """A review's reproduction: one call answered 404 (a balancer sent it to another instance)
    dropped the session at once, and every other tenant's call in flight on it failed as
    retryable after the server had run it."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    waiting = [asyncio.create_task(gw.call("hostile_wait", {"ms": 1500}, tenant="globex")) for _ in range(2)]
    await asyncio.sleep(0.4)
    forgotten = await gw.call("hostile_forget", {})
    assert forgotten["ok"] is False and forgotten["error"]["code"] == "TOOL_EXECUTION_FAILED", forgotten
    for call in waiting:
        assert (await call)["result"] == "waited"
    after = await gw.call("hostile_echo", {"text": "after"}, user="bob", tenant="globex")
    assert after["ok"] is True and after["result"] == "after", after


async def test_a_call_answered_by_an_endless_event_stream_lets_go_of_its_connection_after_its_timeout(
    env: Env, gw: Caller
):
    """A review's reproduction: the call gave up at its timeout, but its request went on
    reading comments (each read within the read timeout) and held its connection until the
    session died; a hundred such held every connection of the MCP servers' pool."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    env.hostile.mode = "drip_calls"
    try:
        calls = await asyncio.gather(*(gw.call("hostile_echo", {"text": "held"}) for _ in range(3)))
        assert [c["error"]["code"] for c in calls] == ["TOOL_TIMEOUT"] * 3
        await eventually(lambda: _none_dripping(env.hostile), "the dripped answers' connections are let go")
    finally:
        env.hostile.mode = "normal"
    assert (await gw.call("hostile_echo", {"text": "after"}))["result"] == "after"


async def _none_dripping(hostile: HostileMcp) -> bool:
    return hostile.dripping == 0


async def _slow_echoes(gw: Caller, tenants: list[str]) -> list[asyncio.Task[Any]]:
    """Calls that hold their connection until their timeout (mode ``slow_echo``), once they
    are in flight."""
    calls = [asyncio.create_task(gw.call("hostile_echo", {"text": "slow"}, user="bob", tenant=tenant))
             for tenant in tenants]
    await asyncio.sleep(0.4)
    return calls


async def test_one_tenants_calls_to_a_slow_server_leave_other_tenants_a_connection(env: Env, gw: Caller):
    """A review's reproduction: one tenant's hundred calls to a slow server held every
    connection of the pool all MCP servers shared; another tenant's call waited, and timed out.
    A tenant now has at most GATEWAY_TOOL_MAX_REMOTE_CALLS_PER_TENANT calls in flight."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    env.hostile.mode = "slow_echo"
    try:
        held = await _slow_echoes(gw, ["acme"] * (POOL + 1))
        other = await gw.call("hostile_wait", {"ms": 10}, user="bob", tenant="globex")
        assert other["result"] == "waited" and not any(call.done() for call in held)
        assert [(await call)["error"]["code"] for call in held] == ["TOOL_TIMEOUT"] * (POOL + 1)
    finally:
        env.hostile.mode = "normal"


async def test_a_slow_server_holding_its_whole_pool_leaves_other_servers_theirs(env: Env, gw: Caller):
    """Each MCP server has a pool of its own: the hostile server's connections all held, a
    call to another server goes on."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    env.hostile.mode = "slow_echo"
    try:
        held = await _slow_echoes(gw, ["acme"] * TURNS + ["globex"] * (POOL - TURNS))
        other = await gw.call("notes_whoami", {}, user="bob", tenant="globex")
        assert other["ok"] is True, other
        assert not any(call.done() for call in held)
        assert [(await call)["error"]["code"] for call in held] == ["TOOL_TIMEOUT"] * POOL
    finally:
        env.hostile.mode = "normal"


async def test_a_call_whose_event_streams_end_with_retry_zero_reopens_them_a_bounded_number_of_times(
    env: Env, gw: Caller
):
    """A review's reproduction: each event stream answering a call ended at once with
    ``retry: 0``, and the SDK reopened it at once, recursively, until Python's recursion limit
    ended the session every tenant shares (a thousand GETs or more in 2–4 s)."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    opened = env.hostile.seen.count("initialize")
    env.hostile.mode = "retry_zero"
    try:
        call = await ends_within(BOUND_S, gw.call("hostile_echo", {"text": "x"}))
        assert call.result()["error"]["code"] == "TOOL_EXECUTION_FAILED", call.result()
        reopened = env.hostile.seen.count("GET resume")
        assert 0 < reopened <= MAX_REOPENS_PER_CALL
        await asyncio.sleep(1.5)
        assert env.hostile.seen.count("GET resume") == reopened
    finally:
        env.hostile.mode = "normal"
    assert (await gw.call("hostile_echo", {"text": "after"}))["result"] == "after"
    assert env.hostile.seen.count("initialize") == opened  # the session every tenant shares stayed
    assert env.hostile.seen.count("GET") == 0  # and never opened a stream of its own


async def _fails_alone(env: Env, gw: Caller, mode: str) -> dict[str, Any]:
    """The answer to a call of ``hostile_echo`` in ``mode``, made while another tenant's call
    to the same server is in flight: that call must succeed, and the session they share stay."""
    await eventually(lambda: hostile_served(gw), "the hostile server's tools are listed")
    opened = env.hostile.seen.count("initialize")
    env.hostile.mode = mode
    try:
        other = asyncio.create_task(gw.call("hostile_wait", {"ms": 3500}, user="bob", tenant="globex"))
        await asyncio.sleep(0.3)
        failed = await gw.call("hostile_echo", {"text": "x"})
        assert (await other)["result"] == "waited"
    finally:
        env.hostile.mode = "normal"
    assert env.hostile.seen.count("initialize") == opened
    return failed


async def test_one_tenants_call_timing_out_fails_that_call_only_not_the_session_others_share(env: Env, gw: Caller):
    """A review's reproduction: a call's request read past the call's timeout raised in the
    SDK's task for that request, which ended the session: another tenant's call in flight to
    the same server failed with TOOL_EXECUTION_FAILED at that moment."""
    timed_out = await _fails_alone(env, gw, "slow_echo")
    assert timed_out["error"]["code"] == "TOOL_TIMEOUT", timed_out


async def test_a_compressed_answer_to_one_call_fails_that_call_only(env: Env, gw: Caller):
    """A review's reproduction: the transport refused a compressed answer by raising in the
    SDK's task for the request, which ended the session every tenant shares."""
    refused = await _fails_alone(env, gw, "compressed_echo")
    assert refused["error"]["code"] == "TOOL_EXECUTION_FAILED" and refused["error"]["retryable"] is False, refused
