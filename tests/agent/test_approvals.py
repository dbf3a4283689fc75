"""A call that needs an approval stops the loop; resume continues with the stored result."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from tests.agent.conftest import decoded, tool_messages
from tests.support.scripted_model import Turn, call, openai_turn
from tests.support.tokens import auth_for


def report(request: dict[str, Any]) -> Turn:
    result = decoded(tool_messages(request)[-1]["content"])
    return openai_turn(f"done: {result}")


async def test_a_pending_approval_stops_the_run_and_resume_continues_with_the_stored_result(gateway_any_db, model):
    gateway = gateway_any_db
    model.script(
        openai_turn("Creating it.", calls=[call("create_article", {"title": "Q3", "body": "Numbers."}, "call_new"),
                                           call("add", {"a": 2, "b": 3}, "call_add")]),
        report,
    )
    response = await gateway.chat("write an article", user="bob")
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    stop = body["gateway"]["stop_reason"]
    assert choice["finish_reason"] == "stop"
    assert stop["code"] == "APPROVAL_REQUIRED"
    approval_id = stop["approval_ids"][0]
    assert approval_id in choice["message"]["content"] and "create_article" in choice["message"]["content"]
    assert stop["pending"] == [{"approval_id": approval_id, "tool_call_id": "call_new", "tool": "create_article",
                                "arguments": {"title": "Q3", "body": "Numbers."}}]
    assert [t["outcome"] for t in body["gateway"]["trace"]] == ["APPROVAL_REQUIRED", "OK"]
    assert model.served == 1
    run_id = body["gateway"]["run_id"]
    assert (await gateway.run(run_id, user="bob"))["state"] == "awaiting_approval"

    # Before anyone decides, resuming says it is still pending and the model is not asked.
    early = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob"))
    assert early.status_code == 200, early.text
    assert early.json()["gateway"]["stop_reason"]["approval_ids"] == [approval_id]
    assert model.served == 1

    decided = await gateway.http.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert decided.status_code == 200, decided.text

    resumed = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob"))
    assert resumed.status_code == 200, resumed.text
    body = resumed.json()
    assert body["choices"][0]["finish_reason"] == "stop" and body["gateway"]["stop_reason"] is None
    assert model.served == 2
    # the model got the stored result in place of the pending one, aligned with its call
    sent = tool_messages(model.requests[1])
    assert [m["tool_call_id"] for m in sent] == ["call_new", "call_add"]
    created = decoded(sent[0]["content"])
    assert created["ok"] is True and created["result"]["title"] == "Q3"
    assert "APPROVAL_REQUIRED" not in str(model.requests[1]["messages"])
    assert body["usage"]["total_tokens"] == 50  # both model calls of the run

    run = await gateway.run(run_id, user="bob")
    assert run["state"] == "completed"
    assert decoded(run["messages"][2]["content"])["ok"] is True

    again = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob"))
    assert again.status_code == 409 and again.json()["error"]["code"] == "RUN_NOT_RESUMABLE"


async def test_a_rejected_approval_reaches_the_model_as_approval_rejected(gateway, model):
    model.script(openai_turn(calls=[call("delete_article", {"article_id": "art_demo_acme_1"}, "call_del")]), report)
    body = (await gateway.chat("delete the first article", user="bob")).json()
    approval_id = body["gateway"]["stop_reason"]["approval_ids"][0]
    rejected = await gateway.http.post(f"/v1/admin/approvals/{approval_id}/reject", json={"reason": "keep it"},
                                       headers=auth_for("carol"))
    assert rejected.status_code == 200, rejected.text
    resumed = await gateway.http.post(f"/v1/runs/{body['gateway']['run_id']}/resume", headers=auth_for("bob"))
    assert resumed.status_code == 200, resumed.text
    assert decoded(tool_messages(model.requests[1])[0]["content"])["error"]["code"] == "APPROVAL_REJECTED"


async def test_resume_is_only_for_the_runs_owner_and_for_agent_runs(gateway, model):
    model.script(openai_turn(calls=[call("create_article", {"title": "A", "body": "B"})]))
    body = (await gateway.chat("write", user="bob")).json()
    run_id = body["gateway"]["run_id"]
    other = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("alice"))
    assert other.status_code == 404
    foreign = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob", "globex"))
    assert foreign.status_code == 404
    plain = (await gateway.http.post("/v1/runs", headers=auth_for("bob"))).json()
    refused = await gateway.http.post(f"/v1/runs/{plain['id']}/resume", headers=auth_for("bob"))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "RUN_NOT_RESUMABLE"


async def test_resume_while_the_approved_call_still_runs_keeps_waiting_for_its_outcome(gateway, model):
    model.script(openai_turn(calls=[call("create_article", {"title": "Slow", "body": "B"}, "call_slow")]), report)
    body = (await gateway.chat("write", user="bob")).json()
    run_id, approval_id = body["gateway"]["run_id"], body["gateway"]["stop_reason"]["approval_ids"][0]

    # The approved call's write waits on a lock, so the approval stays "executing" meanwhile.
    locker = await asyncpg.connect(gateway.database_url.replace("postgresql+asyncpg://", "postgresql://", 1))
    locking = locker.transaction()
    await locking.start()
    await locker.execute("LOCK TABLE articles IN ACCESS EXCLUSIVE MODE")
    approving = asyncio.create_task(
        gateway.http.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol")))
    try:
        for _ in range(200):
            [(status,)] = await gateway.sql("SELECT status FROM approvals WHERE id = :id", id=approval_id)
            if status == "executing":
                break
            await asyncio.sleep(0.02)
        assert status == "executing"
        early = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob"))
        assert early.status_code == 200, early.text
        assert early.json()["gateway"]["stop_reason"]["approval_ids"] == [approval_id]
        assert model.served == 1  # the model is not told the call is in progress as if it were its outcome
        run = await gateway.run(run_id, user="bob")
        assert run["state"] == "awaiting_approval"
        assert decoded(run["messages"][-1]["content"])["error"]["code"] == "APPROVAL_REQUIRED"
    finally:
        await locking.rollback()
        await locker.close()
    assert (await approving).status_code == 200

    resumed = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob"))
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["gateway"]["stop_reason"] is None
    created = decoded(tool_messages(model.requests[1])[0]["content"])
    assert created["ok"] is True and created["result"]["title"] == "Slow"
    assert (await gateway.run(run_id, user="bob"))["state"] == "completed"
