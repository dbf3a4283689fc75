"""Per call, before anything is counted: the tool exists, the caller may use it, its arguments
decode strictly. Each failure answers that call alone; the others in the batch go on."""

from __future__ import annotations

import json

import pytest

from tests.support import db
from tests.support.calls import create_run, outcome, send, send_one, tool_call
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

ALICE, BOB = auth_for("alice"), auth_for("bob")


async def test_an_unknown_tool_is_tool_not_found(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "transfer_money", {"amount": 1})
    assert outcome(content) == "TOOL_NOT_FOUND" and content["error"]["retryable"] is False


async def test_tool_not_found_comes_before_invalid_arguments(client):
    run = await create_run(client, ALICE)
    (content,) = await send(client, run["id"], ALICE, tool_call("nope", raw="not json", call_id="c1"))
    assert outcome(content) == "TOOL_NOT_FOUND"


async def test_a_tool_that_is_not_granted_is_permission_denied_never_tool_not_found(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "delete_article", {"article_id": "art_demo_acme_1"})
    assert outcome(content) == "PERMISSION_DENIED"


async def test_permission_denied_comes_before_invalid_arguments_and_reveals_no_schema(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "update_article", {"nonsense": True})
    assert outcome(content) == "PERMISSION_DENIED"
    text = json.dumps(content)
    for word in ("article_id", "properties", "title", "body", "articles:write", "nonsense"):
        assert word not in text


async def test_a_denied_call_does_not_create_an_approval_nor_count(client, database_url):
    run = await create_run(client, ALICE)
    await send_one(client, run["id"], ALICE, "c1", "create_article", {"title": "t", "body": "b"})
    assert await db.approvals(database_url, run_id=run["id"]) == []
    assert (await client.get(f"/v1/runs/{run['id']}", headers=ALICE)).json()["usage"]["tool_calls"] == 0


@pytest.mark.parametrize(
    ("arguments", "field"),
    [({"a": "5", "b": 1}, "a"), ({"a": 5.0, "b": 1}, "a"), ({"a": 1, "b": True}, "b"), ({"a": 1}, "b")],
    ids=["string-for-int", "float-for-int", "bool-for-int", "missing"],
)
async def test_arguments_decode_strictly_without_coercion(client, arguments, field):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "add", arguments)
    assert outcome(content) == "INVALID_ARGUMENTS"
    assert f"`{field}`" in content["error"]["message"]


async def test_an_id_argument_with_a_final_newline_is_invalid_arguments(client):
    # Python's `$` matches before a final newline: the id's pattern must not let it through.
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "get_article", {"article_id": "art_demo_acme_1\n"})
    assert outcome(content) == "INVALID_ARGUMENTS"
    assert "`article_id`" in content["error"]["message"]


@pytest.mark.parametrize("field", ["user_id", "tenant_id", "role", "roles", "author_id"])
async def test_an_identity_field_in_the_arguments_is_invalid_arguments_naming_it(client, database_url, field):
    run = await create_run(client, BOB)
    arguments = {"title": "t", "body": "b", field: "carol"}
    content = await send_one(client, run["id"], BOB, "c1", "create_article", arguments)
    assert outcome(content) == "INVALID_ARGUMENTS"
    assert f"`{field}`" in content["error"]["message"]
    assert await db.approvals(database_url, run_id=run["id"]) == []


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", "42", '"a string"', "null"])
async def test_arguments_that_are_not_a_json_object_are_invalid_arguments(client, raw):
    run = await create_run(client, ALICE)
    (content,) = await send(client, run["id"], ALICE, tool_call("add", raw=raw, call_id="c1"))
    assert outcome(content) == "INVALID_ARGUMENTS"


async def test_arguments_may_be_sent_as_an_object(client):
    run = await create_run(client, ALICE)
    (content,) = await send(client, run["id"], ALICE, tool_call("add", raw={"a": 2, "b": 3}, call_id="c1"))
    assert content == {"ok": True, "result": 5}


async def test_a_sensitive_value_is_never_echoed(client, database_url, logs):
    run = await create_run(client, ALICE)
    secrets = ["hunter2", "hunter2-in-the-vault"]
    contents = await send(
        client, run["id"], ALICE,
        tool_call("login", {"username": "alice", "password": secrets[0]}, call_id="c1"),
        tool_call("login", {"username": "alice", "password": "long-enough-pw", "vault": secrets[1]}, call_id="c2"),
    )
    assert [outcome(c) for c in contents] == ["INVALID_ARGUMENTS", "INVALID_ARGUMENTS"]
    everything_stored = json.dumps([tuple(r) for r in await db.audit_rows(database_url, run_id=run["id"])], default=str)
    for secret in secrets:
        assert secret not in json.dumps(contents)
        assert secret not in logs.text
        assert secret not in everything_stored


async def test_each_call_is_checked_on_its_own_and_answers_keep_the_given_order(client):
    run = await create_run(client, ALICE)
    contents = await send(
        client, run["id"], ALICE,
        tool_call("nope", {}, call_id="z"),
        tool_call("add", {"a": 1, "b": 1}, call_id="y"),
        tool_call("delete_article", {"article_id": "a"}, call_id="x"),
        tool_call("add", {"a": "1", "b": 1}, call_id="w"),
        tool_call("multiply", {"a": 3, "b": 4}, call_id="v"),
    )
    assert [outcome(c) for c in contents] == ["TOOL_NOT_FOUND", "OK", "PERMISSION_DENIED", "INVALID_ARGUMENTS", "OK"]
    assert contents[1]["result"] == 2 and contents[4]["result"] == 12


async def test_invalid_calls_do_not_count_against_the_budget(client):
    run = await create_run(client, ALICE, max_tool_calls=1)
    await send(
        client, run["id"], ALICE,
        tool_call("nope", {}, call_id="a"),
        tool_call("create_article", {}, call_id="b"),
        tool_call("add", {"a": "x"}, call_id="c"),
    )
    assert outcome(await send_one(client, run["id"], ALICE, "d", "add", {"a": 1, "b": 2})) == "OK"


@pytest.mark.parametrize(
    "arguments",
    [{"query": "a\u0000b"}, {"query": "policy", "limit": 5, "\u0000": 1}],
    ids=["nul-in-a-value", "nul-in-a-key"],
)
async def test_a_nul_character_in_the_arguments_is_invalid_arguments_not_a_server_error(client, arguments):
    # PostgreSQL text and jsonb cannot hold NUL: it must be refused before anything is stored.
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "search_articles", arguments)
    assert outcome(content) == "INVALID_ARGUMENTS"
    assert outcome(await send_one(client, run["id"], ALICE, "c2", "add", {"a": 1, "b": 2})) == "OK"


async def test_a_key_given_twice_in_arguments_is_invalid_arguments_and_nothing_runs(client, database_url):
    run = await create_run(client, BOB)
    title = "Twice-keyed title"
    contents = await send(
        client, run["id"], BOB,
        tool_call("add", raw='{"a": 1, "b": 2, "a": 40}', call_id="c1"),
        tool_call("create_article", raw=f'{{"title": "harmless", "body": "b", "title": "{title}"}}', call_id="c2"),
        tool_call("add", {"a": 1, "b": 2}, call_id="c3"),
    )
    assert [outcome(c) for c in contents] == ["INVALID_ARGUMENTS", "INVALID_ARGUMENTS", "OK"]
    assert "`a` is given more than once" in contents[0]["error"]["message"]
    assert "`title` is given more than once" in contents[1]["error"]["message"]
    assert await db.approvals(database_url, run_id=run["id"]) == []
    audited = {r.tool_call_id: r.outcome for r in await db.audit_rows(database_url, run_id=run["id"])}
    assert audited == {"c1": "INVALID_ARGUMENTS", "c2": "INVALID_ARGUMENTS", "c3": "OK"}


async def test_a_key_given_twice_in_the_batch_rejects_it_whole(client, database_url):
    run = await create_run(client, ALICE)
    body = ('{"tool_calls": [{"id": "c1", "type": "function", '
            '"function": {"name": "add", "arguments": {"a": 1, "b": 2, "b": 3}}}]}')
    response = await client.post(f"/v1/runs/{run['id']}/tool-calls", content=body, headers=ALICE)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "INVALID_TOOL_CALL"
    assert "`b` is given more than once" in response.json()["error"]["message"]
    assert (await client.get(f"/v1/runs/{run['id']}", headers=ALICE)).json()["usage"]["tool_calls"] == 0
