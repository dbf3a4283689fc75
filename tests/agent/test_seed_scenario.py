"""The seed scenario end to end: three calls in one round, one a business error, two rounds."""

from __future__ import annotations

from typing import Any

from tests.agent.conftest import decoded, tool_messages
from tests.support.scripted_model import Turn, call, openai_turn

QUESTION = "compute 10 divided by 0, then 10 divided by 2, and tell me both results with the current time"


def final_answer(request: dict[str, Any]) -> Turn:
    results = [decoded(m["content"]) for m in tool_messages(request)]
    zero, half, now = results
    text = (f"10 / 0 is not possible ({zero['error']['message']}); 10 / 2 = {half['result']}; "
            f"the time is {now['result']}.")
    return openai_turn(text, prompt_tokens=197, completion_tokens=79)


async def test_divide_by_zero_reaches_the_model_as_a_business_error_and_the_loop_ends_in_two_rounds(
    gateway_any_db, model
):
    model.script(
        openai_turn(calls=[call("divide", {"a": 10, "b": 0}, "call_a"), call("divide", {"a": 10, "b": 2}, "call_b"),
                           call("get_current_time", {}, "call_c")], prompt_tokens=150, completion_tokens=40),
        final_answer,
    )
    response = await gateway_any_db.chat(QUESTION)
    assert response.status_code == 200, response.text
    body = response.json()

    assert model.served == 2
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert "10 / 2 = 5" in choice["message"]["content"]
    assert "not possible" in choice["message"]["content"]
    # usage is summed exactly over the run's two model calls
    assert body["usage"] == {"prompt_tokens": 150 + 197, "completion_tokens": 40 + 79, "total_tokens": 466}

    gateway = body["gateway"]
    assert gateway["stop_reason"] is None and gateway["state"] == "completed" and gateway["steps"] == 2
    assert [(t["tool_call_id"], t["outcome"]) for t in gateway["trace"]] == [
        ("call_a", "BUSINESS_RULE_VIOLATION"), ("call_b", "OK"), ("call_c", "OK")]

    # Round 2 saw the assistant message first, then one tool message per call, aligned by id, in order.
    second = model.requests[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool", "tool", "tool"]
    assert [c["id"] for c in second[1]["tool_calls"]] == ["call_a", "call_b", "call_c"]
    assert [m["tool_call_id"] for m in second[2:]] == ["call_a", "call_b", "call_c"]
    error = decoded(second[2]["content"])["error"]
    assert error["code"] == "BUSINESS_RULE_VIOLATION" and error["retryable"] is False
    assert decoded(second[3]["content"]) == {"ok": True, "result": 5}

    # The tools the caller may see, sorted by name, identical in both rounds.
    names = [t["function"]["name"] for t in model.requests[0]["tools"]]
    assert names == sorted(names) and "divide" in names and "create_article" not in names
    assert model.requests[0]["tools"] == model.requests[1]["tools"]

    run = await gateway_any_db.run(gateway["run_id"])
    assert run["state"] == "completed"
    assert run["usage"]["total_tokens"] == 466 and run["usage"]["model_calls"] == 2
    assert run["usage"]["tool_calls"] == 3
    assert [m["role"] for m in run["messages"]] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    assert run["messages"][-1]["content"] == choice["message"]["content"]
