"""The scripted demo model: its keyword rules, its labels, and that it exists only in demo mode."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from gateway.llm.base import SamplingOptions
from gateway.llm.demo_model import DEMO_MODEL, PREFIX, DemoScriptedModel, answer, check_demo_model, plan
from gateway.llm.providers import ModelProviders
from gateway.observability.metrics import Metrics
from gateway.settings import Settings, SettingsError

TOOLS = [{"type": "function", "function": {"name": name}}
         for name in ("add", "multiply", "divide", "get_current_time", "create_article")]
DEMO_PROVIDER = [{"name": "scripted", "kind": "demo", "base_url": "http://127.0.0.1:9/v1", "model": "x"}]


def user(text: str) -> dict[str, object]:
    return {"role": "user", "content": text}


def called(call_id: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": msgspec.json.encode(arguments).decode()}}
    ]}


def result(call_id: str, content: object) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": call_id, "content": msgspec.json.encode(content).decode()}


def test_plan_follows_the_message_order_and_reads_the_numbers():
    calls = plan('Divide 10 by 2, add 2 and 3, then create an article titled "Hello" and tell me the time')
    assert [(c.name, c.arguments.get("a"), c.arguments.get("b")) for c in calls] == [
        ("divide", 10, 2), ("add", 2, 3), ("create_article", None, None), ("get_current_time", None, None)
    ]
    assert calls[2].arguments["title"] == "Hello"


def test_a_message_naming_many_calls_plans_a_bounded_number():
    assert len(plan("add 1 and 2, " * 1000)) == 8


def test_the_model_calls_one_tool_per_round_then_answers_in_words_labelled_as_the_demo_model():
    history = [user("add 2 and 3, then create an article")]
    first = answer(history, TOOLS, SamplingOptions())
    assert [(c.name, msgspec.json.decode(c.arguments)) for c in first.tool_calls] == [("add", {"a": 2, "b": 3})]
    history += [called("c1", "add", {"a": 2, "b": 3}), result("c1", {"ok": True, "result": 5})]
    second = answer(history, TOOLS, SamplingOptions())
    assert [c.name for c in second.tool_calls] == ["create_article"]
    history += [called("c2", "create_article", {"title": "t", "body": "b"}),
                result("c2", {"ok": True, "result": {"id": "art_1", "title": "t"}})]
    final = answer(history, TOOLS, SamplingOptions())
    assert not final.tool_calls
    assert final.content.startswith(PREFIX)
    assert final.content == f'{PREFIX} add returned 5; create_article returned art_1 "t".'


def test_a_call_waiting_for_approval_makes_the_model_say_it_waits():
    history = [user("create an article"), called("c1", "create_article", {"title": "t", "body": "b"}),
               result("c1", {"ok": False, "error": {"code": "APPROVAL_REQUIRED", "message": "m", "approval_id": "apr_1"}})]
    waiting = answer(history, TOOLS, SamplingOptions())
    assert not waiting.tool_calls
    assert waiting.content.startswith(PREFIX) and "create_article is waiting for an approver" in waiting.content


def test_a_tool_it_was_not_offered_is_not_called_and_the_answer_says_so():
    history = [user("add 2 and 3, then create an article")]
    offered = [t for t in TOOLS if t["function"]["name"] != "create_article"]
    history += [called("c1", "add", {"a": 2, "b": 3}), result("c1", {"ok": True, "result": 5})]
    final = answer(history, offered, SamplingOptions())
    assert not final.tool_calls and "I may not use create_article" in final.content


def test_an_error_result_is_reported_by_its_code():
    history = [user("divide 1 by 0"), called("c1", "divide", {"a": 1, "b": 0}),
               result("c1", {"ok": False, "error": {"code": "BUSINESS_RULE_VIOLATION", "message": "no"}})]
    assert "divide did not succeed (BUSINESS_RULE_VIOLATION)" in answer(history, TOOLS, SamplingOptions()).content


@pytest.mark.parametrize("text", ["hello", "", "add \x00 and 3", "add 2 and " + "9" * 5000, "a" * 200_000,
                                  "ａｄｄ ２ and ３", "time" * 10_000])
def test_hostile_or_unknown_messages_get_a_labelled_answer_or_a_bounded_plan(text):
    message = answer([user(text)], TOOLS, SamplingOptions())
    if message.tool_calls:
        assert len(message.tool_calls) == 1
    else:
        assert message.content.startswith(PREFIX) and "scripted demo model" in message.content


def test_hostile_tool_results_do_not_break_the_answer():
    deep = "[" * 5000 + "]" * 5000
    history = [user("add 1 and 2"), called("c1", "add", {"a": 1, "b": 2}),
               {"role": "tool", "tool_call_id": "c1", "content": deep}]
    assert "add did not succeed (an unreadable result)" in answer(history, TOOLS, SamplingOptions()).content


def test_tool_choice_none_gets_no_tool_call():
    message = answer([user("add 2 and 3")], TOOLS, SamplingOptions(tool_choice="none"))
    assert not message.tool_calls and message.content.startswith(PREFIX)


async def test_chat_reports_its_name_and_a_usage():
    model = DemoScriptedModel(DEMO_MODEL, Metrics())
    done = await model.chat([user("what time is it?")], TOOLS, options=SamplingOptions())
    assert done.model == DEMO_MODEL and done.finish_reason == "tool_calls"
    assert done.usage.total_tokens > 0


def test_outside_demo_mode_asking_for_the_demo_model_is_refused():
    for settings in (Settings.from_env({"GATEWAY_LLM_KIND": "demo"}),
                     Settings.from_env({"GATEWAY_LLM_PROVIDERS": msgspec.json.encode(DEMO_PROVIDER).decode()})):
        with pytest.raises(SettingsError, match="only in demo mode"):
            check_demo_model(settings)


async def test_outside_demo_mode_no_provider_means_no_demo_model_and_in_demo_mode_it_is_the_default():
    async with httpx.AsyncClient() as http:
        with pytest.raises(SettingsError, match="only in demo mode"):
            ModelProviders(Settings.from_env({"GATEWAY_LLM_KIND": "demo"}), http, Metrics())
        assert ModelProviders(Settings.from_env({}), http, Metrics()).names == []
        demo = ModelProviders(Settings.from_env({"GATEWAY_DEMO": "true"}), http, Metrics())
        assert demo.names == [DEMO_MODEL] and demo.choose(None, pinned=None).model == DEMO_MODEL
        configured = ModelProviders(
            Settings.from_env({"GATEWAY_DEMO": "true", "GATEWAY_LLM_BASE_URL": "http://127.0.0.1:9/v1",
                               "GATEWAY_LLM_MODEL": "real"}), http, Metrics())
        assert configured.names == ["default"]
