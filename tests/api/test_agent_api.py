"""The agent loop's routes through the test client: documented, authenticated, validated."""

from __future__ import annotations

from tests.support.tokens import auth_for


async def test_the_agent_routes_are_in_the_openapi_document(client):
    document = (await client.get("/schema/openapi.json")).json()
    assert "post" in document["paths"]["/v1/chat/completions"]
    assert "post" in document["paths"]["/v1/runs/{run_id}/resume"]
    assert "get" in document["paths"]["/v1/models"]


async def test_the_chat_route_needs_a_token_and_a_valid_body(client):
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 401
    bad = await client.post("/v1/chat/completions", json={"model": "default", "messages": []},
                            headers=auth_for("alice"))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_REQUEST"
    unknown = await client.post("/v1/chat/completions", json={**body, "n": 2}, headers=auth_for("alice"))
    assert unknown.status_code == 400


async def test_without_a_provider_the_chat_route_answers_model_not_configured_and_starts_no_run(client):
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
    response = await client.post("/v1/chat/completions", json=body, headers=auth_for("alice"))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "MODEL_NOT_CONFIGURED"


async def test_resuming_an_unknown_run_is_not_found(client):
    response = await client.post("/v1/runs/run_nope/resume", headers=auth_for("alice"))
    assert response.status_code == 404


async def test_a_plain_run_shows_no_loop_state(client):
    created = (await client.post("/v1/runs", headers=auth_for("alice"))).json()
    assert created["state"] is None and created["messages"] == []
    assert created["usage"] == {"tool_calls": 0, "model_calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                "total_tokens": 0}
