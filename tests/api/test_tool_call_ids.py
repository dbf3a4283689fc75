"""A known tool_call_id is a replay only when it names the same call (tool and canonical
arguments); any other call under it is TOOL_CALL_ID_CONFLICT: audited, not retryable, and
nothing runs. PostgreSQL."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from gateway.db.models import ToolCall
from tests.support import db
from tests.support.calls import create_run, outcome, send, send_one, tool_call
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

ALICE, BOB = auth_for("alice"), auth_for("bob")


async def usage(client, run_id: str) -> int:
    return (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()["usage"]["tool_calls"]


def assert_conflict(content: dict) -> None:
    assert content["ok"] is False, content
    assert content["error"]["code"] == "TOOL_CALL_ID_CONFLICT" and content["error"]["retryable"] is False
    assert "result" not in content


async def test_the_same_id_for_the_same_call_is_a_replay(pg_client, probe):
    run = await create_run(pg_client, ALICE)
    first = await send_one(pg_client, run["id"], ALICE, "call_0", "count", {"text": "a"})
    again = await send_one(pg_client, run["id"], ALICE, "call_0", "count", {"text": "a"})
    assert again == first == {"ok": True, "result": {"executions": 1}}
    assert probe.executions == {"call_0": 1}


async def test_the_same_id_for_another_tool_is_a_conflict_and_runs_nothing(pg_client, probe):
    run = await create_run(pg_client, ALICE)
    assert await send_one(pg_client, run["id"], ALICE, "call_2", "divide", {"a": 10, "b": 2}) == {"ok": True, "result": 5}
    assert_conflict(await send_one(pg_client, run["id"], ALICE, "call_2", "add", {"a": 1, "b": 2}))
    assert_conflict(await send_one(pg_client, run["id"], ALICE, "call_2", "count", {}))
    assert probe.executions == {}


async def test_the_same_id_for_the_same_tool_with_other_arguments_is_a_conflict(pg_client, probe):
    run = await create_run(pg_client, ALICE)
    assert await send_one(pg_client, run["id"], ALICE, "call_1", "add", {"a": 1, "b": 2}) == {"ok": True, "result": 3}
    assert_conflict(await send_one(pg_client, run["id"], ALICE, "call_1", "add", {"a": 1, "b": 0}))
    assert await send_one(pg_client, run["id"], ALICE, "call_3", "count", {"text": "a"}) == {
        "ok": True, "result": {"executions": 1}
    }
    assert_conflict(await send_one(pg_client, run["id"], ALICE, "call_3", "count", {"text": "b"}))
    assert probe.executions == {"call_3": 1}


@pytest.mark.parametrize(
    "raw",
    ['{"b": 2, "a": 1}', '{ "a" :1,\n\t"b": 2 }', '{"a":1,"b":2}'],
    ids=["key-order", "whitespace", "compact"],
)
async def test_whitespace_and_key_order_do_not_make_another_call(pg_client, raw):
    run = await create_run(pg_client, ALICE)
    (first,) = await send(pg_client, run["id"], ALICE, tool_call("add", call_id="c1", raw='{"a": 1, "b": 2}'))
    (again,) = await send(pg_client, run["id"], ALICE, tool_call("add", call_id="c1", raw=raw))
    assert again == first == {"ok": True, "result": 3}
    assert await usage(pg_client, run["id"]) == 1


async def test_a_conflict_counts_against_nothing_and_leaves_the_stored_call_answering(pg_client, probe):
    run = await create_run(pg_client, ALICE, max_tool_calls=2)
    first = await send_one(pg_client, run["id"], ALICE, "c1", "count", {"text": "a"})
    for _ in range(3):
        assert_conflict(await send_one(pg_client, run["id"], ALICE, "c1", "count", {"text": "b"}))
    assert await usage(pg_client, run["id"]) == 1
    assert await send_one(pg_client, run["id"], ALICE, "c1", "count", {"text": "a"}) == first
    assert outcome(await send_one(pg_client, run["id"], ALICE, "c2", "count", {"text": "b"})) == "OK"
    assert probe.executions == {"c1": 1, "c2": 1}


async def test_a_conflict_in_a_batch_decides_only_that_call(pg_client, probe):
    run = await create_run(pg_client, ALICE)
    await send_one(pg_client, run["id"], ALICE, "c1", "count", {"text": "a"})
    answers = await send(
        pg_client, run["id"], ALICE,
        tool_call("count", {"text": "b"}, call_id="c1"),
        tool_call("count", {"text": "c"}, call_id="c2"),
    )
    assert_conflict(answers[0])
    assert outcome(answers[1]) == "OK"
    assert probe.executions == {"c1": 1, "c2": 1}


async def test_a_conflict_is_audited_with_the_new_call_and_the_stored_one(pg_client, seeded_pg_url):
    run = await create_run(pg_client, ALICE)
    await send_one(pg_client, run["id"], ALICE, "c1", "divide", {"a": 10, "b": 2})
    await pg_client.post(
        f"/v1/runs/{run['id']}/tool-calls",
        json={"tool_calls": [tool_call("add", {"a": 1, "b": 2}, call_id="c1")]},
        headers={**ALICE, "X-Request-ID": "reuse-1"},
    )
    (row,) = await db.audit_rows(seeded_pg_url, run_id=run["id"], kind="tool_call_conflict")
    assert (row.user_id, row.tool_call_id, row.tool, row.outcome, row.request_id) == (
        "alice", "c1", "add", "TOOL_CALL_ID_CONFLICT", "reuse-1"
    )
    assert row.arguments == {"a": 1, "b": 2}
    assert row.arguments_sha256 == hashlib.sha256(b'{"a":1,"b":2}').hexdigest()
    assert row.detail == {
        "stored_tool": "divide", "stored_arguments_sha256": hashlib.sha256(b'{"a":10,"b":2}').hexdigest()
    }


async def test_a_pending_approvals_id_reused_for_other_arguments_creates_nothing(pg_client, seeded_pg_url, probe):
    run = await create_run(pg_client, BOB)
    held = await send_one(pg_client, run["id"], BOB, "c1", "write_note", {"text": "one"})
    assert outcome(held) == "APPROVAL_REQUIRED"
    assert_conflict(await send_one(pg_client, run["id"], BOB, "c1", "write_note", {"text": "two"}))
    (approval,) = await db.approvals(seeded_pg_url, run_id=run["id"])
    assert (approval.id, approval.status, approval.canonical_arguments) == (
        held["error"]["approval_id"], "pending", '{"text":"one"}'
    )
    again = await send_one(pg_client, run["id"], BOB, "c1", "write_note", {"text": "one"})
    assert outcome(again) == "APPROVAL_REQUIRED" and again["error"]["approval_id"] == approval.id
    assert probe.executions == {}


async def test_a_stored_call_without_an_arguments_hash_matches_no_call(pg_client, seeded_pg_url):
    """A call stored before ids were bound to their arguments, whose audit row is gone: its
    arguments are unknown, so no call can prove to be it."""
    run = await create_run(pg_client, ALICE)
    await send_one(pg_client, run["id"], ALICE, "c1", "add", {"a": 1, "b": 2})
    table = ToolCall.__table__
    await db.execute(seeded_pg_url, sa.update(table).where(table.c.run_id == run["id"]).values(arguments_sha256=None))
    assert_conflict(await send_one(pg_client, run["id"], ALICE, "c1", "add", {"a": 1, "b": 2}))


async def test_a_refused_call_is_matched_on_its_arguments_as_sent(pg_client):
    """Arguments that never decoded have no canonical form: only the same text replays."""
    run = await create_run(pg_client, ALICE)
    (first,) = await send(pg_client, run["id"], ALICE, tool_call("nope", call_id="c1", raw='{"a":1}'))
    assert outcome(first) == "TOOL_NOT_FOUND"
    (again,) = await send(pg_client, run["id"], ALICE, tool_call("nope", call_id="c1", raw='{"a":1}'))
    assert again == first
    (spaced,) = await send(pg_client, run["id"], ALICE, tool_call("nope", call_id="c1", raw='{"a": 1}'))
    assert_conflict(spaced)
