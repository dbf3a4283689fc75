"""What the model is sent: trimmed history, well-formed tool messages, the caller's tools only."""

from __future__ import annotations

from typing import Any

import pytest

from tests.agent.conftest import LEAKY_SECRET, decoded, tool_messages
from tests.support.scripted_model import Turn, call, openai_turn
from tests.support.tokens import auth_for


def old_exchange(n: int) -> list[dict[str, Any]]:
    padding = "x" * 1200
    return [
        {"role": "user", "content": f"question {n} {padding}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"old_{n}", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":1}'}}]},
        {"role": "tool", "tool_call_id": f"old_{n}", "content": f'{{"ok":true,"result":2,"pad":"{padding}"}}'},
        {"role": "assistant", "content": f"answer {n} {padding}"},
    ]


@pytest.mark.parametrize("gateway_overrides", [{"llm_context_window": 1500, "llm_history_share": 0.7}])
async def test_history_over_the_window_share_drops_oldest_whole_exchanges_and_no_tool_message_is_orphaned(
    gateway, model
):
    conversation = [{"role": "system", "content": "You are terse."}]
    for n in range(4):
        conversation += old_exchange(n)
    conversation.append({"role": "user", "content": "and now: 2 + 2?"})
    model.script(openai_turn(calls=[call("add", {"a": 2, "b": 2}, "call_now")], prompt_tokens=900),
                 openai_turn("4", prompt_tokens=950))
    response = await gateway.chat(conversation)
    assert response.status_code == 200, response.text
    body = response.json()
    dropped = body["gateway"]["messages_dropped"]
    assert dropped > 0 and dropped % 4 == 0  # whole exchanges only

    for request in model.requests:
        sent = request["messages"]
        assert sent[0] == {"role": "system", "content": "You are terse."}
        assert sent[1]["role"] == "user"  # the kept history starts with a whole exchange
        asked: set[str] = set()
        for message in sent:
            if message["role"] == "assistant":
                asked |= {c["id"] for c in message.get("tool_calls") or ()}
            if message["role"] == "tool":
                assert message["tool_call_id"] in asked, "orphan tool message"
        assert len(sent) < len(conversation) + 3
    # the current exchange is always whole
    last = model.requests[1]["messages"]
    assert [m["role"] for m in last[-3:]] == ["user", "assistant", "tool"]
    assert last[-3]["content"] == "and now: 2 + 2?"
    run = await gateway.run(body["gateway"]["run_id"])
    assert run["messages_dropped"] == dropped
    assert len(run["messages"]) == len(conversation) + 3  # the stored history keeps everything


async def test_an_erroring_tool_reaches_the_model_as_a_safe_error_that_it_then_reports(gateway, model):
    def reports(request: dict[str, Any]) -> Turn:
        error = decoded(tool_messages(request)[0]["content"])["error"]
        return openai_turn(f"The tool failed ({error['code']}, reference {error['error_id']}).")

    model.script(openai_turn(calls=[call("explode", {}, "call_x"), call("refuse", {}, "call_r")]), reports)
    response = await gateway.chat("try it")
    body = response.json()
    sent = tool_messages(model.requests[1])
    failed = decoded(sent[0]["content"])["error"]
    assert failed["code"] == "TOOL_EXECUTION_FAILED" and failed["error_id"].startswith("err_")
    assert decoded(sent[1]["content"])["error"] == {
        "code": "BUSINESS_RULE_VIOLATION", "message": "Never on a Sunday.", "retryable": False}
    assert failed["error_id"] in body["choices"][0]["message"]["content"]
    assert "hunter2" not in str(model.requests) and "hunter2" not in response.text
    assert LEAKY_SECRET not in response.text


async def test_an_empty_tool_result_is_sent_as_an_explicit_placeholder(gateway, model):
    model.script(openai_turn(calls=[call("nothing", {})]), openai_turn("ok"))
    await gateway.chat("do nothing")
    content = tool_messages(model.requests[1])[0]["content"]
    assert content.strip()
    assert decoded(content) == {"ok": True, "result": "(the tool returned no output)"}


async def test_tool_calls_are_run_when_finish_reason_says_stop(gateway, model):
    model.script(openai_turn(calls=[call("add", {"a": 1, "b": 2}, "call_1")], finish_reason="stop"),
                 openai_turn("3"))
    body = (await gateway.chat("1 + 2")).json()
    assert model.served == 2
    assert body["gateway"]["trace"][0]["outcome"] == "OK"
    assert body["choices"][0]["message"]["content"] == "3"


async def test_tool_call_ids_a_model_reuses_are_made_unique_within_the_run(gateway, model):
    model.script(openai_turn(calls=[call("add", {"a": 1, "b": 1}, "call_0")]),
                 openai_turn(calls=[call("add", {"a": 2, "b": 2}, "call_0")]),
                 openai_turn("done"))
    body = (await gateway.chat("add twice")).json()
    ids = [t["tool_call_id"] for t in body["gateway"]["trace"]]
    assert ids[0] == "call_0" and ids[1] != "call_0"
    assert [t["outcome"] for t in body["gateway"]["trace"]] == ["OK", "OK"]  # not a replay of the first
    assert decoded(tool_messages(model.requests[2])[1]["content"]) == {"ok": True, "result": 4}


async def test_a_model_calling_a_tool_the_caller_may_not_use_gets_permission_denied(gateway, model):
    model.script(openai_turn(calls=[call("create_article", {"title": "t", "body": "b"})]), openai_turn("sorry"))
    body = (await gateway.chat("write something")).json()  # alice is a member
    assert body["gateway"]["trace"][0]["outcome"] == "PERMISSION_DENIED"
    assert all(t["function"]["name"] != "create_article" for t in model.requests[0]["tools"])


async def test_a_tool_the_tenant_disabled_is_not_offered_to_the_model(gateway, model):
    disabled = await gateway.http.put("/v1/admin/tools/get_current_time", json={"enabled": False},
                                      headers=auth_for("carol"))
    assert disabled.status_code == 200, disabled.text
    model.script(openai_turn("no clock"))
    await gateway.chat("what time is it?")
    names = [t["function"]["name"] for t in model.requests[0]["tools"]]
    assert "get_current_time" not in names and "divide" in names


async def test_client_tools_are_refused_unless_the_tenant_lets_them_pass_through(gateway, model):
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}}}}
    refused = await gateway.chat("weather in Oslo?", tools=[weather])
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "CLIENT_TOOLS_NOT_ALLOWED"
    assert model.served == 0

    await gateway.set_tenant("acme", allow_client_tools=True)
    model.script(openai_turn(calls=[call("get_weather", {"city": "Oslo"}, "call_w"),
                                    call("get_current_time", {}, "call_t")]),
                 openai_turn("Oslo: 3 degrees."))
    first = await gateway.chat("weather in Oslo?", tools=[weather])
    assert first.status_code == 200, first.text
    body = first.json()
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert body["gateway"]["trace"] == []  # the gateway's own call of that answer was not run
    names = [t["function"]["name"] for t in model.requests[0]["tools"]]
    assert "get_weather" in names and names == sorted(names)

    conversation = [{"role": "user", "content": "weather in Oslo?"}, message,
                    {"role": "tool", "tool_call_id": "call_w", "content": "3 degrees"}]
    second = await gateway.chat(conversation, tools=[weather])
    assert second.status_code == 200, second.text
    assert second.json()["choices"][0]["message"]["content"] == "Oslo: 3 degrees."
    assert tool_messages(model.requests[1]) == [{"role": "tool", "tool_call_id": "call_w", "content": "3 degrees"}]


async def test_a_client_call_does_not_hide_the_refused_calls_of_its_answer_from_the_audit(gateway, model):
    await gateway.set_tenant("acme", allow_client_tools=True)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    model.script(openai_turn(calls=[
        call("get_weather", {"city": "Oslo"}, "c_client"),
        call("\uff41\uff44\uff44", {"a": 1, "b": 2}, "c_fullwidth"),
        call("create_article", {"title": "t", "body": "b"}, "c_forbidden"),
        call("add", "{", "c_broken_arguments"),
        call("add\u0000", {"a": 1, "b": 2}, "c_nul_name"),
        call("add", {"a": 1, "b": 2}, "c_deferred"),
    ]))
    response = await gateway.chat("weather in Oslo?", tools=[weather])
    assert response.status_code == 200, response.text
    assert [c["id"] for c in response.json()["choices"][0]["message"]["tool_calls"]] == ["c_client"]

    audited = dict(await gateway.sql("SELECT tool_call_id, outcome FROM audit_events WHERE tool_call_id IS NOT NULL"))
    assert audited == {
        "c_fullwidth": "TOOL_NOT_FOUND",
        "c_forbidden": "PERMISSION_DENIED",
        "c_broken_arguments": "INVALID_ARGUMENTS",
        "c_nul_name": "INVALID_TOOL_CALL",
    }  # the valid call of the gateway's own is deferred, not run: the model asks again later
    stored = {row[0] for row in await gateway.sql("SELECT tool_call_id FROM tool_calls")}
    assert stored == set(audited)


async def test_a_malformed_conversation_is_refused_before_the_model_is_asked(gateway, model):
    orphan = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "nope", "content": "x"}]
    response = await gateway.chat(orphan)
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST"
    images = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    assert (await gateway.chat(images)).status_code == 400
    assert model.served == 0


async def test_a_run_is_visible_to_its_owner_only(gateway, model):
    model.script(openai_turn("hi"))
    run_id = (await gateway.chat("hello")).json()["gateway"]["run_id"]
    assert (await gateway.http.get(f"/v1/runs/{run_id}", headers=auth_for("bob"))).status_code == 404
    assert (await gateway.http.get(f"/v1/runs/{run_id}", headers=auth_for("alice", "globex"))).status_code == 404
    run = await gateway.run(run_id)
    assert run["provider"] == "default" and run["model"] == "scripted-model"
    assert run["limits"]["max_steps"] == 8 and run["status"] == "active"
