"""Execution: concurrent within a batch, answers in the given order, under a timeout with real
cancellation, failures mapped to codes the model can act on, nothing internal leaked."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.engine import make_url

from tests.support import db
from tests.support.calls import create_run, outcome, send, send_one, tool_call
from tests.support.tokens import auth_for
from tests.support.tools import BIG_RESULT_LIMIT, LEAKY_DETAILS, MISSING_TABLE

pytestmark = pytest.mark.probe_tools

ALICE = auth_for("alice")


async def test_answers_keep_the_order_of_the_calls(client):
    run = await create_run(client, ALICE)
    calls = [tool_call("multiply", {"a": n, "b": 10}, call_id=f"id-{n}") for n in (5, 3, 9, 1, 7)]
    contents = await send(client, run["id"], ALICE, *calls)
    assert [c["result"] for c in contents] == [50, 30, 90, 10, 70]


async def test_the_calls_of_one_batch_run_concurrently(client, probe):
    # Each call waits until all three have started: run one after another, none would finish.
    run = await create_run(client, ALICE)
    calls = [tool_call("rendezvous", {"parties": 3, "party": str(i)}, call_id=f"c{i}") for i in range(3)]
    contents = await send(client, run["id"], ALICE, *calls)
    assert [outcome(c) for c in contents] == ["OK", "OK", "OK"]
    assert probe.arrived == 3


async def test_a_builtin_tool_answers_its_result(client):
    run = await create_run(client, ALICE)
    assert await send_one(client, run["id"], ALICE, "c1", "divide", {"a": 10, "b": 4}) == {"ok": True, "result": 2.5}


async def test_divide_by_zero_is_a_business_rule_violation_that_is_not_retryable(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "divide", {"a": 10, "b": 0})
    assert content == {
        "ok": False,
        "error": {"code": "BUSINESS_RULE_VIOLATION", "message": "Division by zero is not defined.", "retryable": False},
    }


async def test_a_tool_over_its_timeout_is_cancelled_and_answers_retryable_tool_timeout(client, probe):
    run = await create_run(client, ALICE)
    contents = await send(
        client, run["id"], ALICE,
        tool_call("sleep", {"seconds": 30}, call_id="slow"), tool_call("add", {"a": 1, "b": 1}, call_id="fast"),
    )
    assert outcome(contents[0]) == "TOOL_TIMEOUT" and contents[0]["error"]["retryable"] is True
    assert contents[1] == {"ok": True, "result": 2}
    assert probe.started == ["slow"] and probe.cancelled == ["slow"] and probe.finished == []


async def test_an_unexpected_exception_is_tool_execution_failed_and_leaks_nothing(client, logs):
    run = await create_run(client, ALICE)
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": [tool_call("explode", {}, call_id="c1")]}, headers=ALICE
    )
    assert response.status_code == 200
    content = json.loads(response.json()["messages"][0]["content"])
    assert outcome(content) == "TOOL_EXECUTION_FAILED"
    error_id = content["error"]["error_id"]
    assert error_id.startswith("err_")
    for detail in (*LEAKY_DETAILS, "RuntimeError", "Traceback", "could not run"):
        assert detail not in response.text
    (event,) = logs.named("tool_execution_failed")
    assert event["error_id"] == error_id
    assert event["request_id"] == response.headers["x-request-id"]
    assert "Traceback" in event["exception"] and LEAKY_DETAILS[0] in event["exception"]


async def test_a_database_error_inside_a_tool_leaks_no_sql(client, database_url, logs):
    run = await create_run(client, ALICE)
    response = await client.post(
        f"/v1/runs/{run['id']}/tool-calls", json={"tool_calls": [tool_call("bad_sql", {}, call_id="c1")]}, headers=ALICE
    )
    content = json.loads(response.json()["messages"][0]["content"])
    assert outcome(content) == "TOOL_EXECUTION_FAILED"
    url = make_url(database_url)
    host = url.host or str(url.query["host"])  # a TCP host, or the embedded server's socket folder
    for detail in (MISSING_TABLE, "SELECT", "secret_column", host, "sqlalchemy", "asyncpg", "/tmp/"):
        assert detail not in response.text
    (event,) = logs.named("tool_execution_failed")
    assert MISSING_TABLE in event["exception"]


async def test_the_failure_is_stored_with_its_error_id(client, database_url):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "explode", {})
    (row,) = [r for r in await db.audit_rows(database_url, run_id=run["id"]) if r.kind == "tool_call"]
    assert (row.outcome, row.error_id) == ("TOOL_EXECUTION_FAILED", content["error"]["error_id"])


async def test_a_result_over_the_tools_limit_is_truncated_with_marker_and_original_size(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "big", {"size": 500})
    assert content["ok"] is True and content["truncated"] is True
    assert content["original_bytes"] == len(json.dumps("é" * 500, ensure_ascii=False).encode())
    assert content["result"].endswith("[truncated]")
    assert len(content["result"].encode()) <= BIG_RESULT_LIMIT + len("…[truncated]".encode())


async def test_a_result_within_the_limit_is_whole(client):
    run = await create_run(client, ALICE)
    assert await send_one(client, run["id"], ALICE, "c1", "big", {"size": 10}) == {"ok": True, "result": "é" * 10}


async def test_the_current_time_needs_no_arguments(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "get_current_time")
    assert content["ok"] is True and content["result"]["timezone"] == "UTC"
