"""A model's tool calls pass the protocol checks of the tool-calls route, one call at a time,
and nothing a model writes can break a statement other tenants' requests share."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
import sqlalchemy as sa

from tests.agent.conftest import decoded, tool_messages
from tests.support import db
from tests.support.calls import new_run, outcome, send_one
from tests.support.scripted_model import Turn, call, ollama_turn, openai_turn
from tests.support.tokens import auth_for

_ids = itertools.count()


def answer_with(raw_calls: list[dict[str, Any]]) -> Turn:
    """An OpenAI-format answer whose ``tool_calls`` are exactly ``raw_calls``."""
    turn = openai_turn(calls=[call("add", {"a": 1, "b": 1})])
    turn.body["choices"][0]["message"]["tool_calls"] = raw_calls  # type: ignore[index]
    return turn


def raw(name: Any, *, call_id: Any = "call_x", type_: Any = "function", arguments: str = '{"a": 1, "b": 2}') -> dict:
    return {"id": call_id, "type": type_, "function": {"name": name, "arguments": arguments}}


GOOD = raw("add", call_id="call_good")


@pytest.mark.parametrize(
    ("bad", "code", "says"),
    [
        (raw("divide\u0000"), "INVALID_TOOL_CALL", "must not contain NUL"),
        (raw(""), "INVALID_TOOL_CALL", "function.name is missing or empty"),
        (raw(None), "INVALID_TOOL_CALL", "function.name is missing or empty"),
        (raw("ａｄｄ"), "TOOL_NOT_FOUND", "No tool named"),  # full-width letters
        (raw("Add"), "TOOL_NOT_FOUND", "No tool named"),
        (raw("add "), "TOOL_NOT_FOUND", "No tool named"),
        (raw("add", type_="tool"), "INVALID_TOOL_CALL", 'type must be "function"'),
        (raw("add", call_id="x" * 200), "INVALID_TOOL_CALL", "id is longer than 128"),
        (raw("add", call_id="call\u0000nul"), "INVALID_TOOL_CALL", "id must not contain NUL"),
        (raw("add", call_id="   "), "INVALID_TOOL_CALL", "id is missing or empty"),
    ],
    ids=["nul-in-name", "empty-name", "no-name", "full-width-name", "other-case", "trailing-space",
         "wrong-type", "long-id", "nul-in-id", "blank-id"],
)
async def test_a_call_breaking_the_protocol_is_answered_with_the_routes_code_audited_and_not_run(
    gateway, model, bad, code, says
):
    model.script(answer_with([bad, GOOD]), openai_turn("done"))
    response = await gateway.chat("add 1 and 2")
    assert response.status_code == 200, response.text
    body = response.json()
    bad_trace, good_trace = body["gateway"]["trace"]
    assert bad_trace["outcome"] == code and good_trace["outcome"] == "OK"  # the sibling still ran
    answered = tool_messages(model.requests[1])
    assert [m["tool_call_id"] for m in answered] == [bad_trace["tool_call_id"], "call_good"]
    error = decoded(answered[0]["content"])["error"]
    assert error["code"] == code and says in error["message"]

    run_id = body["gateway"]["run_id"]
    audited = {r.tool_call_id: r.outcome for r in await db.audit_rows(gateway.database_url, run_id=run_id)}
    assert audited == {bad_trace["tool_call_id"]: code, "call_good": "OK"}
    run = await gateway.run(run_id)
    assert run["state"] == "completed"
    assert "\u0000" not in response.text


async def test_calls_sharing_an_id_in_one_answer_are_all_answered_duplicate_and_none_runs(gateway, model):
    model.script(answer_with([raw("add", call_id="same"), raw("add", call_id="same", arguments='{"a": 5, "b": 5}'),
                              GOOD]),
                 openai_turn("done"))
    body = (await gateway.chat("add")).json()
    trace = body["gateway"]["trace"]
    assert [t["outcome"] for t in trace] == ["DUPLICATE_TOOL_CALL_ID", "DUPLICATE_TOOL_CALL_ID", "OK"]
    assert len({t["tool_call_id"] for t in trace}) == 3  # each answered under an id of its own
    assert trace[0]["tool_call_id"] == "same"
    calls = await db.tool_call_rows(gateway.database_url, body["gateway"]["run_id"])
    assert sorted(c.outcome for c in calls) == ["DUPLICATE_TOOL_CALL_ID", "DUPLICATE_TOOL_CALL_ID", "OK"]


async def test_text_postgres_cannot_store_is_kept_replaced_in_the_runs_history(gateway, model):
    model.script(answer_with([raw("divide\u0000", call_id="call_nul")]), openai_turn("the answer is \u0000 42"))
    response = await gateway.chat("divide")
    assert response.status_code == 200, response.text
    run = await gateway.run(response.json()["gateway"]["run_id"])
    assert run["state"] == "completed"
    assistant = [m for m in run["messages"] if m["role"] == "assistant"]
    assert assistant[0]["tool_calls"][0]["function"]["name"] == "divide\ufffd"
    assert assistant[-1]["content"] == "the answer is \ufffd 42"
    audited = await db.audit_rows(gateway.database_url, run_id=run["id"])
    assert [(r.tool, r.outcome) for r in audited] == [("divide\ufffd", "INVALID_TOOL_CALL")]


async def test_a_client_message_holding_nul_is_refused_before_a_run_is_made(gateway, model):
    model.script(openai_turn("hello"))
    response = await gateway.chat("hello \u0000 there")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_REQUEST"
    assert "NUL" in response.json()["error"]["message"]
    assert model.served == 0


def hostile(request: dict[str, Any]) -> Turn:
    """Asks for "divide\\u0000" until it has a tool result, then answers."""
    if request["messages"][-1]["role"] == "tool":
        return openai_turn("I could not divide.")
    return openai_turn(calls=[call("divide\u0000", {"a": 1, "b": 2}, f"call_hostile_{next(_ids)}")])


# 180 calls of one user at once: far above a user's default rate, which is not what this tests.
@pytest.mark.parametrize("gateway_overrides", [{"rate_limit_user_rps": 0.0, "rate_limit_tenant_rps": 0.0}])
async def test_a_hostile_tool_name_fails_no_other_tenants_request_and_its_run_ends(gateway, model):
    model.script(hostile)
    globex = auth_for("alice", "globex")
    runs = [await new_run(gateway.http, "alice", "globex") for _ in range(6)]

    async def globex_call(n: int) -> str:
        content = await send_one(gateway.http, runs[n % len(runs)], globex, f"g{n}", "add", {"a": n, "b": 1})
        return outcome(content)

    chats = [gateway.chat(f"divide {n}") for n in range(8)]
    results = await asyncio.gather(*chats, *(globex_call(n) for n in range(180)))
    chat_responses, globex_outcomes = results[:8], results[8:]

    assert globex_outcomes == ["OK"] * 180
    for response in chat_responses:
        assert response.status_code == 200, response.text
        body = response.json()
        assert [t["outcome"] for t in body["gateway"]["trace"]] == ["INVALID_TOOL_CALL"]
        run = await gateway.run(body["gateway"]["run_id"])
        assert run["state"] == "completed"
    assert await gateway.sql("SELECT id FROM runs WHERE loop_state = 'running'") == []


async def test_a_run_whose_end_state_cannot_be_written_is_marked_failed_not_left_running(gateway, model):
    # The database refuses the last message of this run, whatever the gateway does with its text.
    await db.execute(gateway.database_url, sa.text(
        """CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.message->>'content' = 'poison' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$"""
    ))
    await db.execute(gateway.database_url, sa.text("CREATE TRIGGER refuse_poison BEFORE INSERT ON run_messages "
                                                   "FOR EACH ROW EXECUTE FUNCTION refuse_poison()"))
    model.script(openai_turn("poison"))
    response = await gateway.chat("hello")
    assert response.status_code == 500
    states = await gateway.sql("SELECT loop_state, stop_reason FROM runs WHERE loop_state IS NOT NULL")
    assert [tuple(s) for s in states] == [("failed", "INTERNAL_ERROR")]


@pytest.mark.parametrize("gateway_overrides", [{"max_batch_size": 2}])
async def test_calls_past_the_batch_limit_are_answered_invalid_audited_and_not_run(gateway, model):
    sent = [raw("add", call_id=f"call_{i}", arguments=f'{{"a": {i}, "b": 0}}') for i in range(4)]
    model.script(answer_with(sent), openai_turn("done"))
    response = await gateway.chat("add")
    assert response.status_code == 200, response.text
    body = response.json()
    assert [t["outcome"] for t in body["gateway"]["trace"]] == ["OK", "OK", "INVALID_TOOL_CALL", "INVALID_TOOL_CALL"]

    # The next round answers every call of the assistant message, in order.
    next_round = model.requests[1]["messages"]
    assistant = next(m for m in next_round if m["role"] == "assistant")
    ids = [f"call_{i}" for i in range(4)]
    assert [c["id"] for c in assistant["tool_calls"]] == ids
    answered = tool_messages(model.requests[1])
    assert [m["tool_call_id"] for m in answered] == ids
    for extra in answered[2:]:
        error = decoded(extra["content"])["error"]
        assert error["code"] == "INVALID_TOOL_CALL" and "not run" in error["message"]

    run_id = body["gateway"]["run_id"]
    audited = {r.tool_call_id: r.outcome for r in await db.audit_rows(gateway.database_url, run_id=run_id)}
    assert audited == {"call_0": "OK", "call_1": "OK", "call_2": "INVALID_TOOL_CALL", "call_3": "INVALID_TOOL_CALL"}
    run = await gateway.run(run_id)
    assert run["state"] == "completed"
    assert [m["tool_call_id"] for m in run["messages"] if m["role"] == "tool"] == ids


DEEP_ARGUMENTS = '{"a": ' + "[" * 5000 + "]" * 5000 + ', "b": 1}'
"""Arguments as a JSON *string*: the answer around them is shallow, the text inside is not."""


async def test_arguments_text_nested_too_deep_is_invalid_arguments_not_a_500(gateway, model):
    model.script(answer_with([raw("add", call_id="call_deep", arguments=DEEP_ARGUMENTS), GOOD]),
                 openai_turn("done"))
    response = await gateway.chat("add")
    assert response.status_code == 200, response.text
    trace = response.json()["gateway"]["trace"]
    assert [(t["tool_call_id"], t["outcome"]) for t in trace] == [("call_deep", "INVALID_ARGUMENTS"),
                                                                  ("call_good", "OK")]


@pytest.mark.parametrize("gateway_overrides", [{"kind": "ollama"}])
async def test_ollama_arguments_text_nested_too_deep_does_not_break_the_next_round(gateway, model):
    first = Turn(body={"model": "scripted-model", "done": True, "done_reason": "stop",
                       "message": {"role": "assistant", "content": "",
                                   "tool_calls": [{"function": {"name": "add", "arguments": DEEP_ARGUMENTS}}]}})
    model.script(first, ollama_turn("done"))
    response = await gateway.chat("add")
    assert response.status_code == 200, response.text
    assert [t["outcome"] for t in response.json()["gateway"]["trace"]] == ["INVALID_ARGUMENTS"]
    assert model.served == 2


@pytest.mark.parametrize("gateway_overrides", [{"max_batch_size": 2}])
async def test_an_answer_with_more_than_twice_the_batch_limit_is_refused_whole_and_nothing_is_stored(gateway, model):
    """A hostile model's 20,000 calls in one answer were each answered, audited and stored."""
    sent = [raw("add", call_id=f"call_{i}", arguments=f'{{"a": {i}, "b": 0}}') for i in range(5)]
    model.script(answer_with(sent), openai_turn("done"))
    response = await gateway.chat("add")
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "UPSTREAM_BAD_RESPONSE" and "5 tool calls" in error["message"]
    assert await gateway.sql("SELECT tool_call_id FROM tool_calls") == []
    calls = await gateway.sql("SELECT tool_call_id FROM audit_events WHERE tool_call_id IS NOT NULL")
    assert calls == []
    states = await gateway.sql("SELECT loop_state, stop_reason FROM runs WHERE loop_state IS NOT NULL")
    assert [tuple(s) for s in states] == [("failed", "UPSTREAM_BAD_RESPONSE")]
