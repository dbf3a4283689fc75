"""Each limit stops the run with its own code, inside a normal 200 completion."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.agent.conftest import decoded, tool_messages
from tests.support.scripted_model import Turn, call, openai_turn

_ids = itertools.count()


def same_call_forever(request: dict[str, Any]) -> Turn:
    """A model stuck in a loop: the same call, with a fresh id, every round."""
    return openai_turn(calls=[call("add", {"a": 1, "b": 1}, f"call_{next(_ids)}")])


async def test_a_model_repeating_one_call_gets_repeated_call_past_the_limit_and_ends_at_max_steps(gateway, model):
    model.script(same_call_forever)
    response = await gateway.chat("add 1 and 1", gateway={"max_steps": 5, "max_repeats": 2})
    assert response.status_code == 200, response.text
    body = response.json()

    assert model.served == 5
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["gateway"]["stop_reason"]["code"] == "MAX_STEPS_EXCEEDED"
    assert "MAX_STEPS_EXCEEDED" in body["choices"][0]["message"]["content"]
    outcomes = [t["outcome"] for t in body["gateway"]["trace"]]
    # two runs allowed, then REPEATED_CALL; the fifth answer cannot be followed by a round, so it is not run
    assert outcomes == ["OK", "OK", "REPEATED_CALL", "REPEATED_CALL", "MAX_STEPS_EXCEEDED"]
    # the model read REPEATED_CALL as a tool result
    assert decoded(tool_messages(model.requests[3])[-1]["content"])["error"]["code"] == "REPEATED_CALL"

    run = await gateway.run(body["gateway"]["run_id"])
    assert run["state"] == "stopped" and run["stop_reason"] == "MAX_STEPS_EXCEEDED"
    # no assistant tool call is left without its tool message
    assert run["messages"][-1]["role"] == "tool"
    assert decoded(run["messages"][-1]["content"])["error"]["code"] == "MAX_STEPS_EXCEEDED"


async def test_the_token_budget_is_checked_after_each_answer_and_stops_the_run(gateway, model):
    model.script(lambda request: openai_turn(calls=[call("add", {"a": next(_ids), "b": 1})],
                                             prompt_tokens=300, completion_tokens=100))
    response = await gateway.chat("keep adding", gateway={"max_total_tokens": 1000})
    body = response.json()
    assert response.status_code == 200, response.text
    assert model.served == 3  # 400, 800, then 1200 > 1000
    assert body["usage"]["total_tokens"] == 1200
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["gateway"]["stop_reason"]["code"] == "TOKEN_BUDGET_EXCEEDED"
    assert [t["outcome"] for t in body["gateway"]["trace"]] == ["OK", "OK", "TOKEN_BUDGET_EXCEEDED"]


async def test_a_slow_model_hits_the_run_timeout_which_cancels_the_request_in_flight(gateway, model):
    model.script(openai_turn("too late", delay_s=5.0))
    response = await gateway.chat("hello", gateway={"timeout_s": 0.5})
    body = response.json()
    assert response.status_code == 200, response.text
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["gateway"]["stop_reason"]["code"] == "RUN_TIMEOUT"
    assert body["gateway"]["steps"] == 0
    run = await gateway.run(body["gateway"]["run_id"])
    assert run["state"] == "stopped" and run["stop_reason"] == "RUN_TIMEOUT"


async def test_the_run_timeout_cancels_a_tool_in_flight_and_answers_its_call(gateway, model):
    model.script(openai_turn(calls=[call("sleep", {"seconds": 10}, "call_slow")]), openai_turn("never"))
    response = await gateway.chat("sleep", gateway={"timeout_s": 1.0})
    body = response.json()
    assert body["gateway"]["stop_reason"]["code"] == "RUN_TIMEOUT"
    assert [(t["tool_call_id"], t["outcome"]) for t in body["gateway"]["trace"]] == [("call_slow", "RUN_TIMEOUT")]
    assert model.served == 1
    run = await gateway.run(body["gateway"]["run_id"])
    assert [m["role"] for m in run["messages"]] == ["user", "assistant", "tool"]


async def test_a_request_may_lower_the_limits_but_not_raise_them(gateway, model):
    model.script(openai_turn("hi"))
    body = (await gateway.chat("hi", gateway={"max_steps": 100, "max_total_tokens": 50, "timeout_s": 9999})).json()
    assert body["gateway"]["limits"] == {"max_steps": 8, "max_total_tokens": 50, "timeout_s": 20.0}


@pytest.mark.parametrize("gateway_overrides", [{"run_max_steps": 2}])
async def test_max_steps_defaults_from_the_settings(gateway, model):
    model.script(same_call_forever)
    body = (await gateway.chat("add")).json()
    assert body["gateway"]["limits"]["max_steps"] == 2
    assert body["gateway"]["stop_reason"]["code"] == "MAX_STEPS_EXCEEDED"
    assert model.served == 2
