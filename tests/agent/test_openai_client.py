"""The official ``openai`` client against the gateway, unchanged: base_url = gateway + /v1, api_key = JWT."""

from __future__ import annotations

import openai
import pytest

from tests.support.scripted_model import Turn, call, openai_turn
from tests.support.tokens import make_token


def client_for(gateway, user: str = "alice") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=make_token("acme", user), max_retries=0)


def seed_script(model) -> None:
    model.script(
        openai_turn("Let me compute.", calls=[call("divide", {"a": 10, "b": 0}, "call_a"),
                                              call("divide", {"a": 10, "b": 2}, "call_b")],
                    prompt_tokens=100, completion_tokens=20),
        openai_turn("10 / 0 is undefined and 10 / 2 is 5.", prompt_tokens=160, completion_tokens=15),
    )


async def test_the_official_client_gets_a_completion_with_the_gateway_extension(gateway, model):
    seed_script(model)
    async with client_for(gateway) as client:
        completion = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "10/0 and 10/2?"}],
            extra_body={"gateway": {"max_steps": 4}},
        )
    assert completion.choices[0].message.content == "10 / 0 is undefined and 10 / 2 is 5."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.prompt_tokens == 260 and completion.usage.completion_tokens == 35
    assert completion.usage.total_tokens == 295
    extension = completion.model_extra["gateway"]
    assert extension["limits"]["max_steps"] == 4
    assert [t["outcome"] for t in extension["trace"]] == ["BUSINESS_RULE_VIOLATION", "OK"]
    assert completion.id == "chatcmpl-" + extension["run_id"]


async def test_the_official_client_streams_chunks_and_progress(gateway, model):
    seed_script(model)
    async with client_for(gateway) as client:
        stream = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "10/0 and 10/2?"}], stream=True,
            stream_options={"include_usage": True},
        )
        content, progress, finish, usage = [], [], None, None
        async for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                usage = chunk.usage
            extra = (chunk.model_extra or {}).get("gateway")
            if extra is not None:
                assert chunk.choices == []
                progress.append(extra)
            for choice in chunk.choices:
                if choice.delta.content:
                    content.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
    assert "".join(content) == "10 / 0 is undefined and 10 / 2 is 5."
    assert finish == "stop"
    assert usage is not None and usage.total_tokens == 295
    kinds = [p["type"] for p in progress]
    assert kinds == ["round", "assistant", "tool_call", "tool_call", "tool_result", "tool_result", "round", "done"]
    results = [p for p in progress if p["type"] == "tool_result"]
    assert [(r["tool_call_id"], r["outcome"]) for r in results] == [("call_a", "BUSINESS_RULE_VIOLATION"),
                                                                  ("call_b", "OK")]
    assert progress[-1]["state"] == "completed" and progress[-1]["steps"] == 2


async def test_a_limit_is_still_a_normal_completion_for_the_official_client(gateway, model):
    model.script(lambda request: openai_turn(calls=[call("get_current_time", {})]))
    async with client_for(gateway) as client:
        completion = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "time?"}],
            extra_body={"gateway": {"max_steps": 1}},
        )
    assert completion.choices[0].finish_reason == "length"
    assert "MAX_STEPS_EXCEEDED" in completion.choices[0].message.content
    assert completion.model_extra["gateway"]["stop_reason"]["code"] == "MAX_STEPS_EXCEEDED"


async def test_upstream_failures_reach_the_official_client_as_api_errors(gateway, model):
    model.script(Turn(status=500))
    async with client_for(gateway) as client:
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
        assert failed.value.status_code == 502
        assert failed.value.code == "UPSTREAM_UNAVAILABLE"

        stream = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], stream=True)
        with pytest.raises(openai.APIError) as mid_stream:
            async for _ in stream:
                pass
        assert mid_stream.value.code == "UPSTREAM_UNAVAILABLE"


async def test_client_tools_are_refused_with_a_clear_error(gateway, model):
    async with client_for(gateway) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "hi"}],
                tools=[{"type": "function", "function": {"name": "mine", "parameters": {"type": "object"}}}],
            )
    assert refused.value.code == "CLIENT_TOOLS_NOT_ALLOWED"
    assert "remove `tools`" in refused.value.message
