"""A chat request's size is bounded, and a large one does not hold the process for other callers."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.scripted_model import openai_turn


def one_word_messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "word"} for _ in range(count)]


@pytest.mark.parametrize("gateway_overrides", [{"chat_max_messages": 50}])
async def test_a_conversation_over_the_message_cap_is_refused_before_a_run_or_a_model_call(gateway, model):
    model.script(openai_turn("hello"))
    refused = await gateway.chat(one_word_messages(51))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert "at most 50 messages" in error["message"] and "51" in error["message"]
    assert model.served == 0
    assert await gateway.sql("SELECT id FROM runs WHERE loop_state IS NOT NULL") == []

    accepted = await gateway.chat(one_word_messages(50))
    assert accepted.status_code == 200, accepted.text


async def test_the_default_cap_is_a_thousand_messages(gateway, model):
    model.script(openai_turn("hello"))
    refused = await gateway.chat(one_word_messages(1001))
    assert refused.status_code == 400
    assert "at most 1000 messages" in refused.json()["error"]["message"]


@pytest.mark.parametrize("gateway_overrides", [{"llm_context_window": 200}])
async def test_a_largest_conversation_is_trimmed_while_healthz_keeps_answering(gateway, model):
    """A thousand messages trimmed to a tiny window: the prompt the model gets is the last exchange,
    and a health check sent meanwhile is answered before the chat request finishes."""
    model.script(openai_turn("done", delay_s=2.0))
    chat = asyncio.ensure_future(gateway.chat(one_word_messages(999) + [{"role": "user", "content": "last"}]))
    health = await gateway.http.get("/healthz")
    assert health.status_code == 200
    assert not chat.done()
    response = await chat
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["gateway"]["messages_dropped"] == 999
    assert model.requests[0]["messages"] == [{"role": "user", "content": "last"}]
