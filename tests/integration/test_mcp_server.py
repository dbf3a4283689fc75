"""The gateway as an MCP server, driven by the official MCP SDK's streamable-HTTP client
against real `gateway serve` processes sharing one PostgreSQL database, in both eras of the
protocol: ``initialize`` with ``Mcp-Session-Id`` (the client in ``legacy`` mode) and
``server/discover`` without sessions (``auto`` mode, which adopts 2026-07-28)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import jwt
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.db.models import Run
from tests.support import db
from tests.support.processes import gateways
from tests.support.tokens import auth, make_token

pytestmark = pytest.mark.postgres

ERAS = {"legacy": "2025-11-25", "auto": "2026-07-28"}
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def pair(fleet_database: str) -> Iterator[list[str]]:
    """Two `gateway serve` processes behind no balancer: a test spreads its requests over both.
    Rate limits far above what the module sends: its tests share users, and the budget race
    sends 50 calls at once (a 429 there would be the limiter's answer, not the ledger's)."""
    with gateways(
        fleet_database, 2, policy_cache_s=0, rate_limit_user_rps=100_000, rate_limit_user_burst=100_000,
        rate_limit_tenant_rps=100_000, rate_limit_tenant_burst=100_000,
    ) as started:
        yield [gateway.url for gateway in started]


def token_for(user: str, tenant: str = "acme") -> str:
    """A token of its own (a fresh ``jti``): on 2026-07-28 it has a default run of its own."""
    return make_token(tenant, user, extra={"jti": uuid.uuid4().hex})


@asynccontextmanager
async def connect(base_url: str, token: str, mode: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT) as http:
        transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
        async with Client(transport, mode=mode, cache=None, read_timeout_seconds=TIMEOUT) as client:  # type: ignore[arg-type]
            assert client.protocol_version == ERAS[mode]
            yield client


async def rest_run(base_url: str, token: str, **limits: Any) -> str:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.post(f"{base_url}/v1/runs", json=limits, headers=auth(token))
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def decide(base_url: str, approval_id: str, verdict: str) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.post(
            f"{base_url}/v1/admin/approvals/{approval_id}/{verdict}",
            headers=auth(token_for("carol")),
            json={"reason": "Not this one."} if verdict == "reject" else None,
        )
    assert response.status_code == 200, response.text


def code_of(result: Any) -> str:
    assert result.is_error is True, result
    return result.structured_content["code"]


async def run_row(url: str, run_id: str) -> Any:
    (row,) = await db.rows(url, sa.select(Run.__table__).where(Run.__table__.c.id == run_id))
    return row


@pytest.fixture(params=list(ERAS))
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


async def test_a_member_and_an_admin_see_different_tools(pair, mode):
    async with connect(pair[0], token_for("alice"), mode) as alice, connect(pair[1], token_for("carol"), mode) as carol:
        members = [tool.name for tool in (await alice.list_tools()).tools]
        admins = {tool.name: tool for tool in (await carol.list_tools()).tools}
    assert members == sorted(members) and "add" in members and "create_article" not in members
    assert set(members) < set(admins)
    create = admins["create_article"]
    assert create.annotations.destructive_hint is True and create.annotations.read_only_hint is False
    assert admins["add"].annotations.read_only_hint is True
    assert create.input_schema["additionalProperties"] is False


async def test_a_call_answers_its_result_and_is_audited_with_the_request(pair, mode, fleet_database):
    async with connect(pair[0], token_for("alice"), mode) as alice:
        result = await alice.call_tool("add", {"a": 2, "b": 40})
    assert result.is_error is False
    assert result.structured_content == {"result": 42}
    assert result.content[0].text == "42"
    rows = [r for r in await db.audit_rows(fleet_database, kind="tool_call") if r.tool == "add" and r.outcome == "OK"]
    row = rows[-1]
    assert row.request_id and row.tool_call_id.startswith("mcp_") and row.user_id == "alice"


async def test_a_tool_the_caller_may_not_use_is_permission_denied(pair, mode):
    async with connect(pair[0], token_for("alice"), mode) as alice:
        result = await alice.call_tool("create_article", {"title": "No", "body": "Not allowed."})
    assert code_of(result) == "PERMISSION_DENIED"
    assert result.content[0].text == result.structured_content["message"]
    assert result.structured_content["retryable"] is False


async def test_an_extra_argument_is_invalid_arguments(pair, mode):
    async with connect(pair[1], token_for("alice"), mode) as alice:
        result = await alice.call_tool("add", {"a": 1, "b": 2, "tenant_id": "globex"})
    assert code_of(result) == "INVALID_ARGUMENTS"


async def test_a_named_run_runs_out_of_budget(pair, mode, fleet_database):
    token = token_for("alice")
    run_id = await rest_run(pair[0], token, max_tool_calls=2)
    meta = {"gateway/run_id": run_id}
    async with connect(pair[1], token, mode) as alice:
        answers = [await alice.call_tool("add", {"a": n, "b": 1}, meta=meta) for n in range(3)]
    assert [a.is_error for a in answers] == [False, False, True]
    assert code_of(answers[2]) == "BUDGET_EXCEEDED"
    assert (await run_row(fleet_database, run_id)).used_tool_calls == 2


async def test_another_tenants_run_is_refused(pair, mode):
    foreign = await rest_run(pair[0], token_for("alice", "globex"))
    async with connect(pair[0], token_for("alice"), mode) as alice:
        result = await alice.call_tool("add", {"a": 1, "b": 1}, meta={"gateway/run_id": foreign})
    assert code_of(result) == "NOT_FOUND"


async def test_an_approved_call_answers_its_one_execution_as_often_as_asked(pair, mode, fleet_database):
    title = f"Approved over MCP {uuid.uuid4().hex[:8]}"
    arguments = {"title": title, "body": "Written once."}
    async with connect(pair[0], token_for("bob"), mode) as bob:
        first = await bob.call_tool("create_article", arguments)
        assert code_of(first) == "APPROVAL_REQUIRED"
        approval_id = first.structured_content["approval_id"]
        again = await bob.call_tool("create_article", dict(reversed(list(arguments.items()))))
        assert code_of(again) == "APPROVAL_REQUIRED" and again.structured_content["approval_id"] == approval_id
        assert len(await db.approvals(fleet_database, id=approval_id)) == 1
        await decide(pair[1], approval_id, "approve")
        outcomes = [await bob.call_tool("create_article", arguments) for _ in range(3)]
    assert all(o.is_error is False for o in outcomes)
    assert len({str(o.structured_content) for o in outcomes}) == 1
    assert outcomes[0].structured_content["title"] == title
    assert len(await db.articles(fleet_database, title=title)) == 1
    executed = await db.audit_rows(fleet_database, approval_id=approval_id, kind="tool_call", outcome="OK")
    assert len(executed) == 1
    (approval,) = await db.approvals(fleet_database, id=approval_id)
    assert (await run_row(fleet_database, approval.run_id)).used_tool_calls == 1


async def test_a_rejected_call_answers_its_rejection(pair, mode, fleet_database):
    title = f"Rejected over MCP {uuid.uuid4().hex[:8]}"
    async with connect(pair[1], token_for("bob"), mode) as bob:
        first = await bob.call_tool("create_article", {"title": title, "body": "Never written."})
        await decide(pair[0], first.structured_content["approval_id"], "reject")
        again = await bob.call_tool("create_article", {"title": title, "body": "Never written."})
    assert code_of(again) == "APPROVAL_REJECTED"
    assert await db.articles(fleet_database, title=title) == []


async def test_an_unauthenticated_request_is_401_with_the_metadata_url(pair):
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.post(
            f"{pair[0]}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert response.status_code == 401
        challenge = response.headers["www-authenticate"]
        assert challenge == f'Bearer resource_metadata="{pair[0]}/.well-known/oauth-protected-resource/mcp"'
        metadata = await http.get(f"{pair[0]}/.well-known/oauth-protected-resource/mcp")
    assert metadata.status_code == 200 and metadata.json()["resource"] == f"{pair[0]}/mcp"


async def test_the_sdk_client_without_a_token_cannot_connect(pair, mode):
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the SDK wraps the 401 in its own errors
        async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
            transport = streamable_http_client(f"{pair[0]}/mcp", http_client=http)
            async with Client(transport, mode=mode, cache=None, read_timeout_seconds=TIMEOUT):  # type: ignore[arg-type]
                pass
    assert raised.value is not None


async def test_a_tokens_default_run_is_one_whichever_process_answers(pair, fleet_database):
    token = token_for("alice")
    marker = int(uuid.uuid4().int % 10**9)
    async with connect(pair[0], token, "auto") as first, connect(pair[1], token, "auto") as second:
        await asyncio.gather(first.call_tool("add", {"a": marker, "b": 1}), second.call_tool("add", {"a": marker, "b": 2}))
        await first.call_tool("add", {"a": marker, "b": 3})
    rows = [r for r in await db.audit_rows(fleet_database, kind="tool_call") if r.user_id == "alice"]
    runs = {r.run_id for r in rows if r.arguments and r.arguments.get("a") == marker}
    assert len(runs) == 1
    (run_id,) = runs
    run = await run_row(fleet_database, run_id)
    assert run.used_tool_calls == 3
    token_expires = jwt.decode(token, options={"verify_signature": False})["exp"]
    assert run.expires_at.timestamp() <= token_expires  # the default run expires with its token


async def test_a_session_opened_on_one_process_is_served_by_the_other(pair, fleet_database):
    headers = {**auth(token_for("alice")), "Accept": "application/json, text/event-stream"}
    opening = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        opened = await http.post(f"{pair[0]}/mcp", json=opening, headers=headers)
        assert opened.json()["result"]["protocolVersion"] == "2025-03-26"
        session = opened.headers["mcp-session-id"]
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 7, "b": 7}}}
        answered = await http.post(
            f"{pair[1]}/mcp", json=call, headers={**headers, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-03-26"}
        )
    assert answered.json()["result"]["structuredContent"] == {"result": 14}
    assert (await run_row(fleet_database, session)).used_tool_calls == 1


async def test_another_users_session_is_not_found(pair):
    headers = {**auth(token_for("bob")), "Accept": "application/json"}
    opening = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        alices = await http.post(
            f"{pair[0]}/mcp", json=opening, headers={**auth(token_for("alice")), "Accept": "application/json"}
        )
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1, "b": 1}}}
        response = await http.post(
            f"{pair[1]}/mcp", json=call, headers={**headers, "Mcp-Session-Id": alices.headers["mcp-session-id"]}
        )
    assert response.status_code == 404 and response.json()["error"]["code"] == -32600


async def test_concurrent_calls_across_two_processes_never_exceed_the_budget(pair, mode, fleet_database):
    token = token_for("alice")
    run_id = await rest_run(pair[0], token, max_tool_calls=10)
    meta = {"gateway/run_id": run_id}
    async with connect(pair[0], token, mode) as first, connect(pair[1], token, mode) as second:
        clients = itertools.cycle([first, second])
        answers = await asyncio.gather(
            *(next(clients).call_tool("add", {"a": n, "b": 0}, meta=meta) for n in range(50))
        )
    outcomes = Counter("OK" if not a.is_error else a.structured_content["code"] for a in answers)
    assert outcomes == {"OK": 10, "BUDGET_EXCEEDED": 40}, outcomes
    audit = Counter(r.outcome for r in await db.audit_rows(fleet_database, run_id=run_id))
    assert audit == {"OK": 10, "BUDGET_EXCEEDED": 40}
    assert (await run_row(fleet_database, run_id)).used_tool_calls == 10
