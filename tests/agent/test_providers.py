"""Ollama's native API, several providers, and tenants pinned to one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from gateway.settings import LlmProvider
from tests.agent.conftest import agent_settings, decoded, running_gateway, served_model
from tests.conftest import make_settings
from tests.support.scripted_model import ScriptedModel, Turn, call, ollama_turn, openai_turn
from tests.support.tokens import auth_for


@pytest.fixture
async def second_model() -> AsyncIterator[ScriptedModel]:
    async with served_model() as scripted:
        yield scripted


async def test_the_seed_scenario_through_ollamas_native_api(pg_url, model):
    def answer(request: dict) -> Turn:
        tools = [m for m in request["messages"] if m["role"] == "tool"]
        assert [m.get("tool_name") for m in tools] == ["divide", "divide", "get_current_time"]
        return ollama_turn("10 / 0 is undefined; 10 / 2 = 5.", prompt_tokens=197, completion_tokens=79)

    model.script(
        ollama_turn(calls=[call("divide", {"a": 10, "b": 0}), call("divide", {"a": 10, "b": 2}),
                           call("get_current_time", {})], prompt_tokens=150, completion_tokens=40),
        answer,
    )
    settings = agent_settings(pg_url, model.url, kind="ollama", llm_context_window=4096)
    async with running_gateway(pg_url, settings) as gateway:
        response = await gateway.chat("compute 10 divided by 0, then 10 divided by 2, with the current time")
    assert response.status_code == 200, response.text
    body = response.json()
    assert model.paths == ["/api/chat", "/api/chat"]
    first = model.requests[0]
    assert first["stream"] is False and first["options"]["num_ctx"] == 4096
    names = [t["function"]["name"] for t in first["tools"]]
    assert names == sorted(names)
    # the assistant message goes back with argument objects, as Ollama expects
    assistant = model.requests[1]["messages"][1]
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"a": 10, "b": 0}
    assert [t["outcome"] for t in body["gateway"]["trace"]] == ["BUSINESS_RULE_VIOLATION", "OK", "OK"]
    assert len({t["tool_call_id"] for t in body["gateway"]["trace"]}) == 3  # ids made by the gateway
    assert body["usage"] == {"prompt_tokens": 347, "completion_tokens": 119, "total_tokens": 466}
    assert body["gateway"]["steps"] == 2


async def test_a_request_names_a_provider_and_a_pinned_tenant_always_gets_its_own(pg_url, model, second_model):
    native = LlmProvider(name="native", kind="ollama", base_url=second_model.url, model="small-model")
    other = LlmProvider(name="other", base_url=model.url + "/v1", model="other-model")
    settings = agent_settings(pg_url, model.url, llm_providers=(native, other))
    model.script(openai_turn("from the default"))
    second_model.script(ollama_turn("from native"))
    async with running_gateway(pg_url, settings) as gateway:
        default = (await gateway.chat("hi", model="gpt-anything")).json()
        named = (await gateway.chat("hi", model="native")).json()
        listed = (await gateway.http.get("/v1/models", headers={"Authorization": "Bearer x"}))
        await gateway.set_tenant("globex", llm_provider="native")
        pinned_response = await gateway.chat("hi", tenant="globex")
        assert pinned_response.status_code == 200, pinned_response.text
        pinned = pinned_response.json()
        refused = await gateway.chat("hi", tenant="globex", model="other")
    assert default["choices"][0]["message"]["content"] == "from the default"
    assert named["choices"][0]["message"]["content"] == "from native" and named["model"] == "small-model"
    assert pinned["gateway"]["provider"] == "native"
    assert second_model.requests[1]["model"] == "small-model"
    assert refused.status_code == 403
    assert listed.status_code == 401


async def test_without_a_configured_provider_the_answer_is_model_not_configured(pg_url):
    async with running_gateway(pg_url, make_settings(pg_url)) as gateway:
        response = await gateway.chat("hi")
        models = await gateway.http.get("/v1/models", headers=auth_for("alice"))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "MODEL_NOT_CONFIGURED"
    assert models.json() == {"data": [], "object": "list"}


async def test_ollama_tool_arguments_arrive_decoded_as_the_executor_expects(pg_url, model):
    model.script(ollama_turn(calls=[call("add", {"a": 40, "b": 2})]), ollama_turn("42"))
    settings = agent_settings(pg_url, model.url, kind="ollama")
    async with running_gateway(pg_url, settings) as gateway:
        body = (await gateway.chat("40 + 2")).json()
    assert body["gateway"]["trace"][0]["outcome"] == "OK"
    assert decoded(body["gateway"]["trace"][0]["content"]) == {"ok": True, "result": 42}
    assert json.loads(json.dumps(body["gateway"]["trace"][0]["arguments"])) == {"a": 40, "b": 2}


async def test_a_resumed_run_follows_the_tenants_current_pin_not_the_provider_it_started_with(
    pg_url, model, second_model
):
    """An operator re-pins a tenant (data residency) while a run waits for an approval: the rest of the
    conversation goes to the new provider, and the run says so."""
    residency = LlmProvider(name="eu", base_url=second_model.url + "/v1", model="eu-model")
    settings = agent_settings(pg_url, model.url, llm_providers=(residency,), policy_cache_s=0)
    model.script(openai_turn("Creating it.", calls=[call("create_article", {"title": "Q3", "body": "b"}, "c1")]))
    second_model.script(openai_turn("Created, answered from the EU."))
    async with running_gateway(pg_url, settings) as gateway:
        started = (await gateway.chat("write an article", user="bob")).json()
        run_id = started["gateway"]["run_id"]
        assert started["gateway"]["provider"] == "default"
        approval_id = started["gateway"]["stop_reason"]["approval_ids"][0]
        decided = await gateway.http.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
        assert decided.status_code == 200, decided.text

        await gateway.set_tenant("acme", llm_provider="eu")
        resumed = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob"))
        assert resumed.status_code == 200, resumed.text
        stored = await gateway.sql("SELECT provider, model, loop_state FROM runs WHERE id = :id", id=run_id)
    body = resumed.json()
    assert body["choices"][0]["message"]["content"] == "Created, answered from the EU."
    assert body["gateway"]["provider"] == "eu" and body["model"] == "eu-model"
    assert model.served == 1 and second_model.served == 1
    assert second_model.requests[0]["model"] == "eu-model"
    assert [tuple(r) for r in stored] == [("eu", "eu-model", "completed")]


async def test_a_run_resumed_after_a_pin_to_an_unconfigured_provider_waits_and_asks_no_model(
    pg_url, model
):
    settings = agent_settings(pg_url, model.url, policy_cache_s=0)
    model.script(openai_turn("Creating it.", calls=[call("create_article", {"title": "Q3", "body": "b"}, "c1")]))
    async with running_gateway(pg_url, settings) as gateway:
        started = (await gateway.chat("write an article", user="bob")).json()
        run_id = started["gateway"]["run_id"]
        approval_id = started["gateway"]["stop_reason"]["approval_ids"][0]
        decided = await gateway.http.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
        assert decided.status_code == 200, decided.text
        await gateway.set_tenant("acme", llm_provider="elsewhere")
        resumed = await gateway.http.post(f"/v1/runs/{run_id}/resume", headers=auth_for("bob"))
        state = (await gateway.run(run_id, user="bob"))["state"]
    assert resumed.status_code == 503
    assert resumed.json()["error"]["code"] == "MODEL_NOT_CONFIGURED"
    assert model.served == 1
    assert state == "awaiting_approval"  # it can be resumed once the pin is fixed
