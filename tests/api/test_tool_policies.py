"""A tenant's tool policy shapes GET /v1/tools and execution at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from gateway.admin.operator import OperatorError
from gateway.app import create_app
from gateway.tools.base import Tool, ToolContext, struct_tool
from gateway.tools.builtin import builtin_tools
from gateway.tools.registry import ToolRegistry
from tests.conftest import make_settings, seeded
from tests.support.calls import call_tools, new_run, outcome, set_policy, tool_call, tool_names
from tests.support.db import audit_rows, set_approval_mode
from tests.support.tokens import auth_for


class Nothing(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


@struct_tool(name="slow_report", description="Takes its time.", arguments=Nothing, permission="time:read")
async def slow_report(ctx: ToolContext, args: Nothing) -> object:
    await asyncio.sleep(5)
    return "done"


@pytest.fixture
async def policy_client(database_url: str) -> AsyncIterator[AsyncTestClient]:
    await seeded(database_url)
    registry = ToolRegistry([*builtin_tools(), slow_report])
    app = create_app(make_settings(database_url, audit_seal_interval_s=0), registry=registry)
    async with AsyncTestClient(app=app) as client:
        yield client


async def test_disabled_tool_is_not_listed_and_its_calls_are_permission_denied(policy_client):
    assert "add" in await tool_names(policy_client)
    await set_policy(policy_client, "add", {"enabled": False})

    assert "add" not in await tool_names(policy_client)
    run = await new_run(policy_client)
    [content] = await call_tools(policy_client, run, [tool_call("add", {"a": 1, "b": 2})])
    assert outcome(content) == "PERMISSION_DENIED"
    assert "properties" not in json.dumps(content)  # the schema is not revealed


async def test_a_policy_in_one_tenant_leaves_the_other_tenant_alone(policy_client):
    await set_policy(policy_client, "add", {"enabled": False}, tenant="acme")
    assert "add" in await tool_names(policy_client, tenant="globex")


async def test_allowed_roles_narrow_who_sees_and_calls_the_tool(policy_client):
    await set_policy(policy_client, "multiply", {"allowed_roles": ["admin"]})

    assert "multiply" not in await tool_names(policy_client, "alice")
    assert "multiply" in await tool_names(policy_client, "carol")
    alice_run = await new_run(policy_client, "alice")
    carol_run = await new_run(policy_client, "carol")
    [denied] = await call_tools(policy_client, alice_run, [tool_call("multiply", {"a": 2, "b": 3})], "alice")
    [allowed] = await call_tools(policy_client, carol_run, [tool_call("multiply", {"a": 2, "b": 3})], "carol")
    assert outcome(denied) == "PERMISSION_DENIED"
    assert allowed == {"ok": True, "result": 6}


async def test_allowed_roles_never_grant_a_tool_the_roles_permissions_do_not(policy_client):
    await set_policy(policy_client, "create_article", {"allowed_roles": ["member"]})
    assert "create_article" not in await tool_names(policy_client, "alice")


async def test_approval_mode_always_holds_back_a_read_only_tool(policy_client):
    await set_policy(policy_client, "add", {"approval_mode": "always"})
    run = await new_run(policy_client)
    [content] = await call_tools(policy_client, run, [tool_call("add", {"a": 1, "b": 2})])
    assert outcome(content) == "APPROVAL_REQUIRED"
    assert content["error"]["approval_id"].startswith("apr_")


async def test_approval_mode_never_runs_a_mutating_tool_at_once(policy_client, database_url):
    await set_approval_mode(database_url, "create_article", "never")
    run = await new_run(policy_client, "bob")
    [content] = await call_tools(
        policy_client, run, [tool_call("create_article", {"title": "Now", "body": "No wait."})], "bob"
    )
    assert content["ok"] is True, content
    article_id = content["result"]["id"]
    [read] = await call_tools(policy_client, run, [tool_call("get_article", {"article_id": article_id})], "bob")
    assert read["result"]["title"] == "Now"


async def test_default_mode_still_needs_approval_for_mutating_tools(policy_client):
    run = await new_run(policy_client, "bob")
    [content] = await call_tools(policy_client, run, [tool_call("create_article", {"title": "T", "body": "B"})], "bob")
    assert outcome(content) == "APPROVAL_REQUIRED"


async def test_policy_timeout_replaces_the_tools_timeout(policy_client):
    await set_policy(policy_client, "slow_report", {"timeout_s": 0.2})
    run = await new_run(policy_client)
    [content] = await call_tools(policy_client, run, [tool_call("slow_report")])
    assert outcome(content) == "TOOL_TIMEOUT"
    assert "0.2 s" in content["error"]["message"]


async def test_policy_max_result_bytes_truncates_the_result(policy_client):
    await set_policy(policy_client, "search_articles", {"max_result_bytes": 64})
    run = await new_run(policy_client)
    [content] = await call_tools(policy_client, run, [tool_call("search_articles", {"query": "e"})])
    assert content["ok"] is True
    assert content["truncated"] is True
    assert content["original_bytes"] > 64


async def test_per_run_call_cap_of_a_tool_answers_budget_exceeded_past_it(policy_client):
    """Needs the ledger to count calls per (run, tool) against CallPlan.tool_call_cap."""
    await set_policy(policy_client, "add", {"max_calls_per_run": 2})
    run = await new_run(policy_client)
    contents = await call_tools(
        policy_client, run, [tool_call("add", {"a": i, "b": 1}) for i in range(3)]
        + [tool_call("multiply", {"a": 2, "b": 2})],
    )
    assert [outcome(c) for c in contents] == ["OK", "OK", "BUDGET_EXCEEDED", "OK"]


async def test_a_reset_policy_is_the_default_again(policy_client):
    await set_policy(policy_client, "add", {"enabled": False})
    response = await policy_client.delete("/v1/admin/tools/add", headers=auth_for("carol"))
    assert response.status_code == 200
    assert response.json()["customised"] is False
    assert "add" in await tool_names(policy_client)


async def test_policy_admin_lists_every_tool_with_its_policy(policy_client):
    await set_policy(policy_client, "add", {"enabled": False, "timeout_s": 3})
    response = await policy_client.get("/v1/admin/tools", headers=auth_for("carol"))
    assert response.status_code == 200
    items = {item["tool"]: item for item in response.json()["items"]}
    assert items["add"]["customised"] is True
    assert items["add"]["policy"]["enabled"] is False
    assert items["add"]["effective_timeout_s"] == 3
    assert items["create_article"]["policy"]["approval_mode"] == "mutating"
    assert items["create_article"]["customised"] is False


@pytest.mark.parametrize(
    "body",
    [
        {"approval_mode": "sometimes"},
        {"timeout_s": 0},
        {"max_calls_per_run": 0},
        {"allowed_roles": ["no spaces allowed"]},
        {"allowed_roles": ["editor\n"]},  # `$` alone would let a final newline through
        {"enabled": True, "surprise": 1},
    ],
)
async def test_invalid_policies_are_refused(policy_client, body: dict[str, Any]):
    response = await policy_client.put("/v1/admin/tools/add", json=body, headers=auth_for("carol"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_REQUEST"


async def test_policy_of_an_unknown_tool_is_not_found(policy_client):
    response = await policy_client.put("/v1/admin/tools/no_such_tool", json={}, headers=auth_for("carol"))
    assert response.status_code == 404


async def test_tool_policies_need_tools_manage(policy_client):
    for method, body in (("GET", None), ("PUT", {"enabled": False})):
        response = await policy_client.request(method, "/v1/admin/tools/add", json=body, headers=auth_for("bob"))
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "FORBIDDEN"
    assert "add" in await tool_names(policy_client, "bob")


async def test_a_policy_change_is_audited_with_who_before_and_after(policy_client):
    await set_policy(policy_client, "add", {"enabled": False})
    response = await policy_client.get("/v1/admin/audit", params={"tool": "add"}, headers=auth_for("carol"))
    [row] = [item for item in response.json()["items"] if item["kind"] == "admin_change"]
    assert row["user_id"] == "carol"
    assert row["detail"]["action"] == "tool_policy.update"
    assert row["detail"]["before"]["enabled"] is True
    assert row["detail"]["after"]["enabled"] is False
    assert row["request_id"]


async def test_an_approved_call_honours_a_tool_disabled_since_the_request(policy_client):
    run = await new_run(policy_client, "bob")
    [held] = await call_tools(policy_client, run, [tool_call("create_article", {"title": "T", "body": "B"})], "bob")
    await set_policy(policy_client, "create_article", {"enabled": False})
    approval_id = held["error"]["approval_id"]
    response = await policy_client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert response.status_code == 200
    assert response.json()["outcome"]["code"] == "PERMISSION_DENIED"


# --- letting a tool that changes data run without approval is the operator's decision -----


async def test_tools_manage_alone_cannot_turn_approvals_off_for_a_mutating_tool(policy_client, database_url):
    response = await policy_client.put(
        "/v1/admin/tools/create_article", json={"approval_mode": "never"}, headers=auth_for("carol")
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "FORBIDDEN"
    assert "gateway tenants approval-mode acme create_article never" in response.json()["error"]["message"]
    view = (await policy_client.get("/v1/admin/tools/create_article", headers=auth_for("carol"))).json()
    assert view["policy"]["approval_mode"] == "mutating" and view["customised"] is False
    assert await audit_rows(database_url, tenant_id="acme", kind="admin_change") == []
    run = await new_run(policy_client, "bob")
    [held] = await call_tools(policy_client, run, [tool_call("create_article", {"title": "T", "body": "B"})], "bob")
    assert outcome(held) == "APPROVAL_REQUIRED"


async def test_approval_mode_never_on_a_read_only_tool_is_a_tenant_administrators_choice(policy_client):
    assert (await set_policy(policy_client, "add", {"approval_mode": "never"}))["policy"]["approval_mode"] == "never"


async def test_the_operators_bypass_is_audited_with_before_and_after(policy_client, database_url):
    said = await set_approval_mode(database_url, "create_article", "never")
    assert said == "tenant acme, tool create_article (changes data): calls run without approval"
    [row] = await audit_rows(database_url, tenant_id="acme", kind="admin_change")
    assert (row.user_id, row.tool) == ("operator:cli", "create_article")
    assert row.detail["action"] == "tool_policy.approval_mode"
    assert row.detail["before"]["approval_mode"] == "mutating"
    assert row.detail["after"]["approval_mode"] == "never"
    assert await audit_rows(database_url, tenant_id="globex", kind="admin_change") == []


async def test_an_administrator_may_keep_or_take_back_the_operators_bypass_but_not_grant_it(
    policy_client, database_url
):
    await set_approval_mode(database_url, "create_article", "never")
    kept = await set_policy(policy_client, "create_article", {"approval_mode": "never", "max_calls_per_run": 5})
    assert (kept["policy"]["approval_mode"], kept["policy"]["max_calls_per_run"]) == ("never", 5)
    await set_policy(policy_client, "create_article", {"approval_mode": "mutating"})
    again = await policy_client.put(
        "/v1/admin/tools/create_article", json={"approval_mode": "never"}, headers=auth_for("carol")
    )
    assert again.status_code == 403 and again.json()["error"]["code"] == "FORBIDDEN"


async def test_the_operator_action_keeps_the_policys_other_fields_and_refuses_unknown_names(
    policy_client, database_url
):
    await set_policy(policy_client, "create_article", {"max_calls_per_run": 3})
    await set_approval_mode(database_url, "create_article", "never")
    view = (await policy_client.get("/v1/admin/tools/create_article", headers=auth_for("carol"))).json()
    assert (view["policy"]["approval_mode"], view["policy"]["max_calls_per_run"]) == ("never", 3)
    with pytest.raises(OperatorError, match="no tool 'create_articles'"):
        await set_approval_mode(database_url, "create_articles", "never")
    with pytest.raises(OperatorError, match="no tenant 'initech'"):
        await set_approval_mode(database_url, "create_article", "never", tenant="initech")


class NoteId(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str


def _notes_delete(*, mutates: bool) -> Tool:
    @struct_tool(name="notes_delete", description="Deletes a note.", arguments=NoteId, permission="time:read",
                 mutates=mutates)
    async def notes_delete(ctx: ToolContext, args: NoteId) -> object:
        return {"deleted": args.id}

    return notes_delete


async def test_a_tenant_never_on_a_read_only_tool_is_no_waiver_once_the_tool_changes_data(database_url):
    """An MCP server's tool that read only may later say it changes data (or a tools file may):
    the tenant administrator's `never`, allowed while it read only, must not let it run unapproved."""
    await seeded(database_url)
    registry = ToolRegistry(builtin_tools())
    registry.replace_source("notes", [_notes_delete(mutates=False)])
    app = create_app(make_settings(database_url, audit_seal_interval_s=0), registry=registry)
    async with AsyncTestClient(app=app) as client:
        view = await set_policy(client, "notes_delete", {"approval_mode": "never"})
        assert (view["policy"]["approval_mode"], view["policy"]["approval_waived"]) == ("never", False)
        registry.replace_source("notes", [_notes_delete(mutates=True)])

        run = await new_run(client, "bob")
        [held] = await call_tools(client, run, [tool_call("notes_delete", {"id": "n-42"})], "bob")
        assert outcome(held) == "APPROVAL_REQUIRED"
        # Kept while changing another field (the console's form posts the mode it shows): allowed,
        # and still no waiver.
        resaved = await set_policy(client, "notes_delete", {"approval_mode": "never", "enabled": True,
                                                            "max_calls_per_run": 9})
        assert resaved["policy"]["approval_waived"] is False
        [still_held] = await call_tools(client, run, [tool_call("notes_delete", {"id": "n-44"})], "bob")
        assert outcome(still_held) == "APPROVAL_REQUIRED"

        await set_approval_mode(database_url, "notes_delete", "never", registry=registry)
        view = (await client.get("/v1/admin/tools/notes_delete", headers=auth_for("carol"))).json()
        assert view["policy"]["approval_waived"] is True
        [ran] = await call_tools(client, run, [tool_call("notes_delete", {"id": "n-43"})], "bob")
        assert ran == {"ok": True, "result": {"deleted": "n-43"}}


async def test_the_operators_waiver_survives_a_tenant_change_that_keeps_never_only(policy_client, database_url):
    await set_approval_mode(database_url, "create_article", "never")
    kept = await set_policy(policy_client, "create_article", {"approval_mode": "never", "timeout_s": 5})
    assert kept["policy"]["approval_waived"] is True
    dropped = await set_policy(policy_client, "create_article", {"approval_mode": "always"})
    assert dropped["policy"]["approval_waived"] is False
    run = await new_run(policy_client, "bob")
    [held] = await call_tools(policy_client, run, [tool_call("create_article", {"title": "T", "body": "B"})], "bob")
    assert outcome(held) == "APPROVAL_REQUIRED"


async def test_a_policy_read_can_be_written_back_and_its_waiver_field_grants_nothing(policy_client):
    read = (await policy_client.get("/v1/admin/tools/create_article", headers=auth_for("carol"))).json()["policy"]
    written = await set_policy(policy_client, "create_article", {**read, "timeout_s": 5})
    assert written["policy"]["timeout_s"] == 5 and written["policy"]["approval_waived"] is False
    # Only the operator waives approval: a tenant administrator's `true` is no grant.
    refused = await policy_client.put(
        "/v1/admin/tools/create_article", headers=auth_for("carol"),
        json={"approval_mode": "never", "approval_waived": True},
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
    waived_alone = await set_policy(policy_client, "create_article", {"approval_waived": True})
    assert waived_alone["policy"]["approval_waived"] is False
