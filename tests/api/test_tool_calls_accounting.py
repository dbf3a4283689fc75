"""Budget, repeats, replays and run expiry: what the run's ledger decides per call."""

from __future__ import annotations

import pytest

from tests.support import db
from tests.support.calls import create_run, outcome, send, send_one, tool_call
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

ALICE = auth_for("alice")


async def usage(client, run_id: str) -> int:
    return (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()["usage"]["tool_calls"]


# --- budget ------------------------------------------------------------------------------


async def test_the_call_past_max_tool_calls_is_budget_exceeded(client):
    run = await create_run(client, ALICE, max_tool_calls=2)
    assert outcome(await send_one(client, run["id"], ALICE, "c1", "add", {"a": 1, "b": 1})) == "OK"
    assert outcome(await send_one(client, run["id"], ALICE, "c2", "add", {"a": 1, "b": 2})) == "OK"
    content = await send_one(client, run["id"], ALICE, "c3", "add", {"a": 1, "b": 3})
    assert outcome(content) == "BUDGET_EXCEEDED" and content["error"]["retryable"] is False
    assert await usage(client, run["id"]) == 2


async def test_failed_executions_count_against_the_budget(client, probe):
    run = await create_run(client, ALICE, max_tool_calls=3)
    contents = await send(
        client, run["id"], ALICE,
        tool_call("divide", {"a": 1, "b": 0}, call_id="c1"),
        tool_call("explode", {}, call_id="c2"),
        tool_call("sleep", {"seconds": 30}, call_id="c3"),
    )
    assert [outcome(c) for c in contents] == ["BUSINESS_RULE_VIOLATION", "TOOL_EXECUTION_FAILED", "TOOL_TIMEOUT"]
    assert outcome(await send_one(client, run["id"], ALICE, "c4", "count", {})) == "BUDGET_EXCEEDED"
    assert "c4" not in probe.executions


async def test_the_budget_is_applied_in_order_within_one_batch(client, probe):
    run = await create_run(client, ALICE, max_tool_calls=2)
    calls = [tool_call("count", {"text": str(i)}, call_id=f"c{i}") for i in range(4)]
    contents = await send(client, run["id"], ALICE, *calls)
    assert [outcome(c) for c in contents] == ["OK", "OK", "BUDGET_EXCEEDED", "BUDGET_EXCEEDED"]
    assert set(probe.executions) == {"c0", "c1"}


async def test_a_budget_exceeded_call_is_not_executed(client, probe):
    run = await create_run(client, ALICE, max_tool_calls=1)
    await send_one(client, run["id"], ALICE, "c1", "count", {"text": "1"})
    await send_one(client, run["id"], ALICE, "c2", "count", {"text": "2"})
    assert probe.executions == {"c1": 1}


# --- repeats -----------------------------------------------------------------------------


async def test_the_call_after_max_repeats_identical_calls_is_repeated_call(client):
    run = await create_run(client, ALICE, max_repeats=2)
    codes = [outcome(await send_one(client, run["id"], ALICE, f"c{i}", "add", {"a": 2, "b": 2})) for i in range(3)]
    assert codes == ["OK", "OK", "REPEATED_CALL"]


async def test_repeated_call_is_not_executed_and_not_retryable(client, probe):
    run = await create_run(client, ALICE, max_repeats=1)
    await send_one(client, run["id"], ALICE, "c1", "count", {"text": "same"})
    content = await send_one(client, run["id"], ALICE, "c2", "count", {"text": "same"})
    assert outcome(content) == "REPEATED_CALL" and content["error"]["retryable"] is False
    assert probe.executions == {"c1": 1}


async def test_key_order_does_not_make_calls_different(client):
    run = await create_run(client, ALICE, max_repeats=1)
    await send(client, run["id"], ALICE, tool_call("add", raw='{"a": 1, "b": 2}', call_id="c1"))
    (content,) = await send(client, run["id"], ALICE, tool_call("add", raw='{"b":2,"a":1}', call_id="c2"))
    assert outcome(content) == "REPEATED_CALL"


async def test_default_values_do_not_make_calls_different(client):
    run = await create_run(client, ALICE, max_repeats=1)
    await send_one(client, run["id"], ALICE, "c1", "search_articles", {"query": "policy"})
    content = await send_one(client, run["id"], ALICE, "c2", "search_articles", {"query": "policy", "limit": 10})
    assert outcome(content) == "REPEATED_CALL"


async def test_arguments_as_a_string_or_an_object_are_the_same_call(client):
    run = await create_run(client, ALICE, max_repeats=1)
    await send(client, run["id"], ALICE, tool_call("add", raw='{"a": 1, "b": 2}', call_id="c1"))
    (content,) = await send(client, run["id"], ALICE, tool_call("add", raw={"b": 2, "a": 1}, call_id="c2"))
    assert outcome(content) == "REPEATED_CALL"


async def test_other_arguments_or_another_tool_are_not_repeats(client):
    run = await create_run(client, ALICE, max_repeats=1)
    contents = await send(
        client, run["id"], ALICE,
        tool_call("add", {"a": 1, "b": 2}, call_id="c1"),
        tool_call("add", {"a": 2, "b": 1}, call_id="c2"),
        tool_call("multiply", {"a": 1, "b": 2}, call_id="c3"),
    )
    assert [outcome(c) for c in contents] == ["OK", "OK", "OK"]


async def test_repeats_are_counted_within_one_batch(client):
    run = await create_run(client, ALICE, max_repeats=2)
    calls = [tool_call("add", {"a": 7, "b": 7}, call_id=f"c{i}") for i in range(4)]
    contents = await send(client, run["id"], ALICE, *calls)
    assert [outcome(c) for c in contents] == ["OK", "OK", "REPEATED_CALL", "REPEATED_CALL"]


async def test_repeats_are_counted_per_run(client):
    first = await create_run(client, ALICE, max_repeats=1)
    second = await create_run(client, ALICE, max_repeats=1)
    await send_one(client, first["id"], ALICE, "c1", "add", {"a": 1, "b": 1})
    assert outcome(await send_one(client, second["id"], ALICE, "c1", "add", {"a": 1, "b": 1})) == "OK"


# --- replays of a known tool_call_id ------------------------------------------------------


async def test_a_replayed_id_answers_the_stored_outcome_without_running_again(client, probe):
    run = await create_run(client, ALICE)
    first = await send_one(client, run["id"], ALICE, "c1", "count", {})
    again = await send_one(client, run["id"], ALICE, "c1", "count", {})
    assert again == first and probe.executions == {"c1": 1}


async def test_a_replay_counts_against_neither_budget_nor_repeats(client):
    run = await create_run(client, ALICE, max_tool_calls=3, max_repeats=2)
    await send_one(client, run["id"], ALICE, "c1", "add", {"a": 1, "b": 1})
    for _ in range(3):
        assert outcome(await send_one(client, run["id"], ALICE, "c1", "add", {"a": 1, "b": 1})) == "OK"
    assert await usage(client, run["id"]) == 1
    assert outcome(await send_one(client, run["id"], ALICE, "c2", "add", {"a": 1, "b": 1})) == "OK"
    assert outcome(await send_one(client, run["id"], ALICE, "c3", "add", {"a": 1, "b": 1})) == "REPEATED_CALL"


async def test_a_replay_is_answered_even_when_the_budget_is_used_up(client):
    run = await create_run(client, ALICE, max_tool_calls=1)
    first = await send_one(client, run["id"], ALICE, "c1", "add", {"a": 20, "b": 22})
    assert outcome(await send_one(client, run["id"], ALICE, "c2", "add", {"a": 1, "b": 1})) == "BUDGET_EXCEEDED"
    assert await send_one(client, run["id"], ALICE, "c1", "add", {"a": 20, "b": 22}) == first == {"ok": True, "result": 42}


async def test_a_replayed_failure_is_answered_as_stored(client, probe):
    run = await create_run(client, ALICE)
    first = await send_one(client, run["id"], ALICE, "c1", "explode", {})
    assert await send_one(client, run["id"], ALICE, "c1", "explode", {}) == first
    assert probe.executions == {"c1": 1}


async def test_a_replayed_rejection_is_answered_as_stored(client):
    run = await create_run(client, ALICE)
    first = await send_one(client, run["id"], ALICE, "c1", "nope", {})
    assert await send_one(client, run["id"], ALICE, "c1", "nope", {}) == first
    assert outcome(first) == "TOOL_NOT_FOUND"


async def test_a_retried_batch_replays_known_ids_and_runs_only_the_new_ones(client, probe):
    run = await create_run(client, ALICE)
    c1, c2, c3 = (tool_call("count", {"text": str(n)}, call_id=f"c{n}") for n in (1, 2, 3))
    first = await send(client, run["id"], ALICE, c1, c2)
    retried = await send(client, run["id"], ALICE, c1, c2, c3)
    assert retried[:2] == first
    assert probe.executions == {"c1": 1, "c2": 1, "c3": 1}
    assert await usage(client, run["id"]) == 3


async def test_the_same_id_in_another_run_is_a_new_call(client, probe):
    first = await create_run(client, ALICE)
    second = await create_run(client, ALICE)
    await send_one(client, first["id"], ALICE, "c1", "count", {})
    await send_one(client, second["id"], ALICE, "c1", "count", {})
    assert probe.executions == {"c1": 2}


# --- run expiry --------------------------------------------------------------------------


async def test_a_call_in_an_expired_run_is_run_expired_and_not_executed(client, database_url, probe):
    run = await create_run(client, ALICE)
    await db.expire_run(database_url, run["id"])
    content = await send_one(client, run["id"], ALICE, "c1", "count", {})
    assert outcome(content) == "RUN_EXPIRED" and content["error"]["retryable"] is False
    assert probe.executions == {}
    assert await usage(client, run["id"]) == 0


async def test_an_expired_run_still_answers_replays(client, database_url):
    run = await create_run(client, ALICE)
    first = await send_one(client, run["id"], ALICE, "c1", "add", {"a": 1, "b": 2})
    await db.expire_run(database_url, run["id"])
    assert await send_one(client, run["id"], ALICE, "c1", "add", {"a": 1, "b": 2}) == first


# --- calls that wait for approval are attempts too -----------------------------------------

BOB = auth_for("bob")


async def test_a_call_waiting_for_approval_counts_against_the_budget(client, database_url):
    run = await create_run(client, BOB, max_tool_calls=1)
    first = await send_one(client, run["id"], BOB, "c1", "create_article", {"title": "t", "body": "b"})
    assert outcome(first) == "APPROVAL_REQUIRED"
    second = await send_one(client, run["id"], BOB, "c2", "create_article", {"title": "t2", "body": "b"})
    assert outcome(second) == "BUDGET_EXCEEDED"
    assert len(await db.approvals(database_url, run_id=run["id"])) == 1


async def test_repeating_a_mutating_call_past_the_limit_creates_no_further_approval(client, database_url):
    run = await create_run(client, BOB, max_repeats=2)
    arguments = {"article_id": "art_demo_acme_1"}
    codes = [outcome(await send_one(client, run["id"], BOB, f"c{i}", "delete_article", arguments)) for i in range(3)]
    assert codes == ["APPROVAL_REQUIRED", "APPROVAL_REQUIRED", "REPEATED_CALL"]
    assert len(await db.approvals(database_url, run_id=run["id"])) == 2
