"""Upstream failures are never raw: retried when they may pass, then stable codes with a request id."""

from __future__ import annotations

import pytest

from tests.agent.conftest import agent_settings, running_gateway
from tests.support.scripted_model import Turn, call, ollama_turn, openai_turn
from tests.support.loopback import free_port

API_KEY = "sk-upstream-key-that-must-never-leak-0123456789"


async def test_5xx_and_429_are_retried_and_then_the_run_succeeds(gateway, model):
    model.script(Turn(status=500), Turn(status=429, headers={"Retry-After": "0"}), openai_turn("fine now"))
    response = await gateway.chat("hello")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "fine now"
    assert model.served == 3


async def test_persistent_5xx_is_upstream_unavailable_after_the_retries(gateway, model):
    model.script(Turn(status=503, body={"error": "overloaded at gpu-node-7"}))
    response = await gateway.chat("hello")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "UPSTREAM_UNAVAILABLE"
    assert error["request_id"] == response.headers["x-request-id"]
    assert "gpu-node-7" not in response.text
    assert model.served == 3  # one attempt and GATEWAY_LLM_RETRIES (2) retries
    runs = await gateway.sql("SELECT loop_state, stop_reason FROM runs")
    assert [tuple(r) for r in runs] == [("failed", "UPSTREAM_UNAVAILABLE")]


async def test_a_refused_connection_is_upstream_unavailable(pg_url):
    settings = agent_settings(pg_url, f"http://127.0.0.1:{free_port()}")
    async with running_gateway(pg_url, settings) as gateway:
        response = await gateway.chat("hello")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "UPSTREAM_UNAVAILABLE"


@pytest.mark.parametrize("gateway_overrides", [{"llm_timeout_s": 0.3, "llm_retries": 1}])
async def test_a_model_slower_than_its_request_timeout_is_upstream_timeout(gateway, model):
    model.script(openai_turn("late", delay_s=3.0))
    response = await gateway.chat("hello")
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "UPSTREAM_TIMEOUT"
    assert model.served == 2


@pytest.mark.parametrize(
    "answer",
    [
        Turn(body=b"<html>bad gateway</html>"),
        Turn(body={"choices": []}),
        Turn(body={"choices": [{"message": {"content": 42}}]}),
        Turn(body={"choices": [{"message": {"tool_calls": "not a list"}}]}),
        Turn(body=b'{"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "add", '
                  b'"arguments": {"a": ' + b"[" * 5000 + b"]" * 5000 + b'}}}]}}]}'),
        Turn(body=b'{"padding": ' + b"[" * 5000 + b"]" * 5000 + b', "choices": [{"message": {"content": "hi"}}]}'),
    ],
    ids=["not-json", "no-choices", "content-not-text", "tool-calls-not-a-list", "deep-arguments", "deep-extra-field"],
)
async def test_a_malformed_answer_is_upstream_bad_response_and_not_retried(gateway, model, answer):
    model.script(answer)
    response = await gateway.chat("hello")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "UPSTREAM_BAD_RESPONSE"
    assert model.served == 1


USAGES = [(-5, 3), (5, -1_000_000), (10**30, 5), (2**63, 0), (2**31, 0)]
USAGE_IDS = ["negative-prompt", "negative-completion", "past-int64", "int64-max-plus-one", "past-the-cap"]


@pytest.mark.parametrize(("prompt_tokens", "completion_tokens"), USAGES, ids=USAGE_IDS)
async def test_usage_out_of_range_is_upstream_bad_response_and_the_run_does_not_stay_running(
    gateway, model, prompt_tokens, completion_tokens
):
    model.script(openai_turn("hello", prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))
    response = await gateway.chat("hello")
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "UPSTREAM_BAD_RESPONSE"
    assert model.served == 1
    states = [row.loop_state for row in await gateway.sql("SELECT loop_state FROM runs")]
    assert states and "running" not in states


@pytest.mark.parametrize("gateway_overrides", [{"kind": "ollama"}])
@pytest.mark.parametrize(("prompt_tokens", "completion_tokens"), USAGES, ids=USAGE_IDS)
async def test_ollama_counts_out_of_range_are_upstream_bad_response_too(gateway, model, prompt_tokens,
                                                                        completion_tokens):
    model.script(ollama_turn("hello", prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))
    response = await gateway.chat("hello")
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "UPSTREAM_BAD_RESPONSE"


@pytest.mark.parametrize("gateway_overrides", [{"llm_api_key": API_KEY}])
async def test_the_api_key_goes_to_the_provider_and_never_into_responses_or_logs(gateway, model, capsys):
    model.script(Turn(status=401, body={"error": {"message": f"bad key {API_KEY}"}}))
    response = await gateway.chat("hello")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "UPSTREAM_REJECTED"
    assert model.headers[0]["authorization"] == f"Bearer {API_KEY}"
    assert model.served == 1  # a 4xx is not retried
    model.script(openai_turn("ok"))
    ok = await gateway.chat("hello")
    captured = capsys.readouterr()
    for text in (response.text, ok.text, captured.out, captured.err):
        assert API_KEY not in text
    assert API_KEY not in repr(gateway.settings)


async def test_a_model_server_does_not_choose_the_size_of_the_gateways_log_lines(gateway, model, logs):
    asks = openai_turn(calls=[call("add", {"a": 1, "b": 2})], finish_reason="x" * 300_000)  # disagrees
    asks.body["model"] = "M" * 300_000
    model.script(asks, openai_turn("3"))
    response = await gateway.chat("hello")
    assert response.status_code == 200, response.text
    answered = logs.named("model_answered")
    [disagrees] = logs.named("finish_reason_disagrees")
    assert answered[0]["model"].startswith("MMM") and len(answered[0]["model"]) < 200
    assert disagrees["finish_reason"].startswith("xxx") and len(disagrees["finish_reason"]) < 100
