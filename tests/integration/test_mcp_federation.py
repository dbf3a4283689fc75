"""MCP servers behind the guard, end to end: the gateway (create_app under uvicorn) and real
MCP servers built with the SDK, all on loopback ports, over a real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import structlog

from gateway.app import create_app
from gateway.execution.approvals import idempotency_key_for
from tests.conftest import _admin
from tests.integration.http_env import Caller, seed_with_grants
from tests.support.app import make_settings
from tests.support.calls import batch, tool_call
from tests.support.loopback import ServerThread, free_port, loopback_socket
from tests.support.logs import CapturedLogs
from tests.support.mcp_upstream import McpUpstream, UpstreamState
from tests.support.tokens import SERVICE_SIGNING_KEY, auth_for

REFRESH_S = 0.5
WAIT_S = 15.0

TOOLS_TOML = """
[mcp_servers.notes]
url = "{notes_url}"
include = ["whoami", "write_note", "loose", "fail", "fail_business", "broken", "slow", "big", "nul", "nested"]
error_message_max_chars = 60

[mcp_servers.notes.tools.whoami]
name = "notes_whoami"
permission = "notes:read"

[mcp_servers.notes.tools.write_note]
permission = "notes:write"

[mcp_servers.notes.tools.loose]
permission = "notes:read"

[mcp_servers.notes.tools.fail]
permission = "notes:read"

[mcp_servers.notes.tools.fail_business]
permission = "notes:read"
is_error_code = "BUSINESS_RULE_VIOLATION"
sensitive_fields = ["text"]

[mcp_servers.notes.tools.broken]
permission = "notes:read"

[mcp_servers.notes.tools.slow]
permission = "notes:read"
timeout_s = 0.5

[mcp_servers.notes.tools.big]
permission = "notes:read"
max_result_bytes = 1024

[mcp_servers.notes.tools.nul]
permission = "notes:read"

[mcp_servers.notes.tools.nested]
permission = "notes:read"

[mcp_servers.flaky]
url = "{flaky_url}"
include = ["whoami"]

[mcp_servers.flaky.tools.whoami]
name = "flaky_whoami"
permission = "notes:read"

[mcp_servers.down]
url = "http://127.0.0.1:{down_port}/mcp"
include = ["whoami"]

[mcp_servers.down.tools.whoami]
name = "down_whoami"
permission = "notes:read"
"""

GRANTS = {
    "member": frozenset({"notes:read"}),
    "editor": frozenset({"notes:read", "notes:write"}),
    "admin": frozenset({"notes:read", "notes:write"}),
}


@dataclass
class Env:
    gateway_url: str
    notes: UpstreamState
    flaky: McpUpstream
    logs: CapturedLogs
    down_port: int
    jwks_url: str



@pytest.fixture(scope="module")
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    postgres = request.getfixturevalue("postgres")
    template = request.getfixturevalue("pg_template")
    name = f"gw_mcp_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    logs = CapturedLogs()
    logs.install()
    try:
        database_url = postgres.sqlalchemy_url(name)
        asyncio.run(seed_with_grants(database_url, GRANTS))
        gateway_sock = loopback_socket()
        jwks_url = f"http://127.0.0.1:{gateway_sock.getsockname()[1]}/.well-known/jwks.json"
        notes_state = UpstreamState(jwks_url=jwks_url, audience="notes")
        flaky_state = UpstreamState(jwks_url=jwks_url, audience="flaky")
        tools_file = request.getfixturevalue("tmp_path_factory").mktemp("mcp") / "tools.toml"
        with McpUpstream(notes_state) as notes, McpUpstream(flaky_state) as flaky:
            down_port = free_port()
            tools_file.write_text(TOOLS_TOML.format(notes_url=notes.url, flaky_url=flaky.url, down_port=down_port))
            settings = make_settings(
                database_url,
                tools_file=str(tools_file),
                service_signing_key=SERVICE_SIGNING_KEY,
                mcp_refresh_s=REFRESH_S,
                mcp_list_timeout_s=3.0,
            )
            with ServerThread(create_app(settings), gateway_sock) as gateway:
                yield Env(gateway_url=gateway.url, notes=notes_state, flaky=flaky, logs=logs, down_port=down_port,
                          jwks_url=jwks_url)
    finally:
        structlog.reset_defaults()
        _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def gw(env: Env) -> AsyncIterator[Caller]:
    async with httpx.AsyncClient(base_url=env.gateway_url, timeout=30) as client:
        yield Caller(client)


async def tools_of(gw: Caller, user: str = "bob") -> dict[str, dict[str, Any]]:
    response = await gw.client.get("/v1/tools", headers=auth_for(user))
    assert response.status_code == 200, response.text
    return {t["function"]["name"]: t["function"] for t in response.json()["tools"]}


async def eventually(check: Any, what: str) -> Any:
    """Polls ``check`` (async, returns a truthy value when done) for at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.05)


async def test_only_included_tools_are_offered_under_the_names_the_file_gives(env: Env, gw: Caller):
    tools = await tools_of(gw)
    assert {"notes_whoami", "write_note", "fail", "slow", "big", "flaky_whoami"} <= tools.keys()
    assert "whoami" not in tools  # offered only as the file names it
    assert "secret_tool" not in tools  # not included
    assert "ｗｈｏａｍｉ" not in tools and "work" not in tools
    assert tools["add"]["description"] != "Pretends to be the gateway's built-in."  # the built-in stays
    assert tools["notes_whoami"]["parameters"]["additionalProperties"] is False
    assert "write_note" not in await tools_of(gw, "alice")  # alice (member) lacks notes:write


async def test_a_schema_that_cannot_be_made_strict_is_refused_naming_server_tool_and_path(env: Env, gw: Caller):
    tools = await tools_of(gw)
    assert "loose" not in tools
    assert "notes_whoami" in tools  # the server's other tools are served
    await asyncio.sleep(3 * REFRESH_S)
    refusals = [e for e in env.logs.named("mcp_tool_refused") if e.get("tool") == "loose"]
    assert len(refusals) == 1, refusals  # logged when it happens, not on every refresh
    assert refusals[0]["server"] == "notes"
    assert "options" in refusals[0]["reason"]  # the path of the open object


async def test_upstream_verifies_the_gateway_token_and_sees_the_caller(env: Env, gw: Caller):
    result = await gw.call("notes_whoami", {}, user="alice")
    assert result["ok"] is True, result
    assert result["result"] == {
        "sub": "alice", "tenant_id": "acme", "aud": "notes", "tool_call_id": result["_call_id"],
    }
    other = await gw.call("flaky_whoami", {}, user="bob", tenant="globex")
    assert other["ok"] is True, other
    assert (other["result"]["sub"], other["result"]["tenant_id"], other["result"]["aud"]) == ("bob", "globex", "flaky")


async def test_identity_in_arguments_is_refused_before_the_upstream_is_called(env: Env, gw: Caller):
    before = len(env.notes.subjects)
    result = await gw.call("notes_whoami", {"user_id": "carol"}, user="alice")
    assert result["error"]["code"] == "INVALID_ARGUMENTS"
    assert len(env.notes.subjects) == before


async def test_destructive_tool_needs_an_approval_and_runs_exactly_once(env: Env, gw: Caller):
    before = len(env.notes.writes)
    asked = await gw.call("write_note", {"text": "hello"}, user="bob")
    assert asked["error"]["code"] == "APPROVAL_REQUIRED", asked
    approval_id = asked["error"]["approval_id"]
    assert len(env.notes.writes) == before

    decided = await gw.client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "succeeded"
    assert decided.json()["outcome"]["result"]["written"] == "hello"
    assert len(env.notes.writes) == before + 1
    write = env.notes.writes[-1]
    assert write["sub"] == "bob"  # the requester, not carol who approved
    assert write["idempotency_key"] == idempotency_key_for("acme", approval_id)

    again = await gw.client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert again.status_code == 409
    replay = await gw.client.post(
        f"/v1/runs/{asked['_run']}/tool-calls", headers=auth_for("bob"),
        json=batch(tool_call("write_note", {"text": "hello"}, call_id=asked["_call_id"])),
    )
    assert replay.status_code == 200
    assert '"written":"hello"' in replay.json()["messages"][0]["content"]
    assert len(env.notes.writes) == before + 1


async def test_is_error_is_a_failure_with_the_text_cut_and_control_stripped(env: Env, gw: Caller):
    result = await gw.call("fail", {"text": "no\nway\x07" + "z" * 200})
    assert result["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert result["error"]["retryable"] is False
    assert result["error"]["error_id"].startswith("err_")
    message = result["error"]["message"]
    assert message.startswith("Error executing tool fail: no way")
    assert len(message) <= 60 and message.endswith("…")
    assert "\n" not in message and "\x07" not in message

    business = await gw.call("fail_business", {"text": "not on a weekend"})
    assert business["error"]["code"] == "BUSINESS_RULE_VIOLATION"
    # Its argument is sensitive: the server's text quotes it, the model gets it taken out.
    assert business["error"]["message"] == "Error executing tool fail_business: [REDACTED]"
    assert "weekend" not in business["_raw"]


@pytest.mark.parametrize("mode", ["500", "drop"])
async def test_transport_and_protocol_failures_are_logged_failures(env: Env, gw: Caller, mode: str):
    env.notes.break_calls["broken"] = mode
    try:
        result = await gw.call("broken", {})
    finally:
        env.notes.break_calls.clear()
    assert result["error"]["code"] == "TOOL_EXECUTION_FAILED", result
    error_id = result["error"]["error_id"]
    assert error_id.startswith("err_")
    assert "Internal Server Error" not in result["_raw"]
    assert any(e.get("error_id") == error_id for e in env.logs.events)
    # The server is still served afterwards (a broken session is replaced), and the new
    # session is opened as the gateway, whichever call opened it.
    assert (await gw.call("notes_whoami", {}, user="alice"))["ok"] is True
    senders = env.notes.senders
    assert {(sub, aud) for method, sub, aud in senders if method.startswith(("initialize", "notifications/"))} == {
        ("gateway", "notes")}
    assert ("tools/list", "gateway", "notes") in senders  # the refresh, as the gateway too


async def test_timeout_is_tool_timeout_and_cancels_the_call_upstream(env: Env, gw: Caller):
    cancelled = len(env.notes.cancelled_params)
    result = await gw.call("slow", {"ms": 5000})
    assert result["error"]["code"] == "TOOL_TIMEOUT"
    assert result["error"]["retryable"] is True

    async def cancel_arrived() -> bool:
        return len(env.notes.cancelled_params) > cancelled and env.notes.slow_cancelled >= 1

    await eventually(cancel_arrived, "notifications/cancelled reached the upstream and stopped the tool")
    assert "notifications/cancelled" in env.notes.methods


async def test_oversized_answers_are_refused_and_large_results_truncated(env: Env, gw: Caller):
    refused = await gw.call("big", {"size": 500_000})
    assert refused["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert refused["error"]["retryable"] is False
    assert "x" * 100 not in refused["_raw"]

    cut = await gw.call("big", {"size": 5000})
    assert cut["ok"] is True and cut["truncated"] is True
    assert len(cut["_raw"]) < 2000


async def test_nul_in_an_answer_is_refused(env: Env, gw: Caller):
    result = await gw.call("nul", {})
    assert result["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert "\\u0000" not in result["_raw"] and "before" not in result["_raw"]


async def test_deeply_nested_answers_are_refused(env: Env, gw: Caller):
    shallow = await gw.call("nested", {"depth": 5})
    assert shallow["ok"] is True and shallow["result"]["value"]["d"]["d"]["d"]["d"]["d"] == "bottom"
    for depth in (100, 3000):
        result = await gw.call("nested", {"depth": depth})
        assert result["error"]["code"] == "TOOL_EXECUTION_FAILED", (depth, result["_raw"][:200])
        assert "bottom" not in result["_raw"]


async def test_every_attempt_is_audited(env: Env, gw: Caller):
    run = await gw.new_run("bob")
    outcomes = {}
    for name, arguments in [("notes_whoami", {}), ("fail", {"text": "x"}), ("slow", {"ms": 5000}),
                            ("write_note", {"text": "audited"})]:
        result = await gw.call(name, arguments, user="bob", run=run)
        outcomes[name] = "OK" if result["ok"] else result["error"]["code"]
    assert outcomes == {"notes_whoami": "OK", "fail": "TOOL_EXECUTION_FAILED", "slow": "TOOL_TIMEOUT",
                        "write_note": "APPROVAL_REQUIRED"}
    response = await gw.client.get(f"/v1/admin/audit?run={run}", headers=auth_for("carol"))
    assert response.status_code == 200, response.text
    audited = {(item["tool"], item["outcome"]) for item in response.json()["items"]}
    assert set(outcomes.items()) <= audited, audited


async def test_tool_list_is_byte_stable_between_refreshes(env: Env, gw: Caller):
    first = await gw.client.get("/v1/tools", headers=auth_for("bob"))
    await asyncio.sleep(3 * REFRESH_S)
    second = await gw.client.get("/v1/tools", headers=auth_for("bob"))
    assert first.content == second.content


async def test_a_server_down_at_start_is_absent_and_named_by_readyz(env: Env, gw: Caller):
    tools = await tools_of(gw)
    assert "down_whoami" not in tools
    response = await gw.client.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    down = [part for part in body["degraded"] if part["component"] == "mcp_server:down"]
    assert down and down[0]["reason"]
    result = await gw.call("down_whoami", {})
    assert result["ok"] is False


async def test_a_server_that_goes_down_and_comes_back_loses_then_regains_its_tools(env: Env, gw: Caller):
    assert "flaky_whoami" in await tools_of(gw)
    env.flaky.stop()
    try:
        async def gone() -> bool:
            readiness = (await gw.client.get("/readyz")).json()
            named = any(p["component"] == "mcp_server:flaky" for p in readiness.get("degraded", []))
            return named and "flaky_whoami" not in await tools_of(gw)

        await eventually(gone, "the flaky server's tools are removed and /readyz names it")
        result = await gw.call("flaky_whoami", {})
        assert result["ok"] is False
    finally:
        env.flaky.start()

    async def back() -> bool:
        readiness = (await gw.client.get("/readyz")).json()
        named = any(p["component"] == "mcp_server:flaky" for p in readiness.get("degraded", []))
        return not named and "flaky_whoami" in await tools_of(gw)

    await eventually(back, "the flaky server's tools are back")
    result = await gw.call("flaky_whoami", {}, user="alice")
    assert result["ok"] is True and result["result"]["sub"] == "alice"



async def test_an_oversized_tool_list_is_refused_and_the_server_named_degraded(env: Env, gw: Caller):
    assert "flaky_whoami" in await tools_of(gw)
    env.flaky.state.hostile_list_bytes = 8 * 1024 * 1024
    try:
        async def refused() -> bool:
            readiness = (await gw.client.get("/readyz")).json()
            named = any(p["component"] == "mcp_server:flaky" for p in readiness.get("degraded", []))
            return named and "flaky_whoami" not in await tools_of(gw)

        await eventually(refused, "the oversized list is refused and the server's tools removed")
    finally:
        env.flaky.state.hostile_list_bytes = 0

    async def back() -> bool:
        return "flaky_whoami" in await tools_of(gw)

    await eventually(back, "the server's tools are back with an ordinary list")


async def test_a_server_down_at_start_is_added_by_the_refresh_after_it_comes_up(env: Env, gw: Caller):
    assert "down_whoami" not in await tools_of(gw)
    with McpUpstream(UpstreamState(jwks_url=env.jwks_url, audience="down"), port=env.down_port):
        async def added() -> bool:
            readiness = (await gw.client.get("/readyz")).json()
            named = any(p["component"] == "mcp_server:down" for p in readiness.get("degraded", []))
            return not named and "down_whoami" in await tools_of(gw)

        await eventually(added, "the server that was down at start has its tools added")
        result = await gw.call("down_whoami", {}, user="alice")
        assert result["ok"] is True and result["result"]["aud"] == "down"

    async def removed() -> bool:
        return "down_whoami" not in await tools_of(gw)

    await eventually(removed, "its tools are removed again once it is gone")
