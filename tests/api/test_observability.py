"""What an operator sees: request ids, Server-Timing per stage, Prometheus metrics."""

from __future__ import annotations

import re
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.wiring import services_of
from gateway.observability.timing import STAGES
from tests.support.calls import batch, contents, new_run, outcome, tool_call
from tests.support.prometheus import growth, samples, value
from tests.support.tokens import auth_for

SERVER_TIMING_ENTRY = re.compile(r"^([a-z]+);dur=(\d+\.\d{3})$")


def server_timing(header: str) -> dict[str, float]:
    entries = {}
    for part in header.split(", "):
        match = SERVER_TIMING_ENTRY.match(part)
        assert match, part
        entries[match.group(1)] = float(match.group(2))
    return entries


METRICS_TOKEN = "scrape-token-0123456789abcdef"


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {"metrics_token": METRICS_TOKEN}


async def scrape(client: AsyncTestClient) -> dict:
    """A scrape by the monitoring system: with the token, so its gauges are read now."""
    response = await client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


async def test_tool_call_response_carries_server_timing_for_every_stage(client: AsyncTestClient) -> None:
    run = await new_run(client)
    response = await client.post(
        f"/v1/runs/{run}/tool-calls", json=batch(tool_call("add", {"a": 1, "b": 2})), headers=auth_for("alice")
    )
    assert response.status_code == 200
    timing = server_timing(response.headers["server-timing"])
    assert list(timing) == [*STAGES, "total"]
    assert sum(timing[stage] for stage in STAGES) <= timing["total"] + 0.01  # each entry rounded to 1 µs
    # A pure tool's outcome is stored and audited by the admission statement: no audit stage.
    assert timing["auth"] > 0 and timing["budget"] > 0 and timing["tool"] > 0 and timing["audit"] == 0


async def test_a_call_that_is_not_pure_is_audited_in_its_own_stage(client: AsyncTestClient) -> None:
    run = await new_run(client)
    response = await client.post(
        f"/v1/runs/{run}/tool-calls", json=batch(tool_call("search_articles", {"query": "x"})),
        headers=auth_for("alice"),
    )
    assert response.status_code == 200 and '\\"ok\\":true' in response.text
    timing = server_timing(response.headers["server-timing"])
    assert timing["budget"] > 0 and timing["tool"] > 0 and timing["audit"] > 0


async def test_a_rejected_batch_carries_server_timing_too(client: AsyncTestClient) -> None:
    run = await new_run(client)
    response = await client.post(
        f"/v1/runs/{run}/tool-calls", content=b'{"tool_calls": []}', headers=auth_for("alice")
    )
    assert response.status_code == 422
    assert list(server_timing(response.headers["server-timing"])) == [*STAGES, "total"]


async def test_a_refused_token_still_gets_server_timing_with_its_auth_stage(client: AsyncTestClient) -> None:
    response = await client.post(
        "/v1/runs/run_x/tool-calls", json=batch(tool_call("add", {"a": 1, "b": 2})),
        headers={"Authorization": "Bearer not-a-token"},
    )
    assert response.status_code == 401
    timing = server_timing(response.headers["server-timing"])
    assert timing["auth"] > 0 and timing["budget"] == 0


async def test_public_routes_carry_no_server_timing(client: AsyncTestClient) -> None:
    response = await client.get("/healthz")
    assert "server-timing" not in response.headers


async def test_request_id_is_taken_from_the_header_and_returned(client: AsyncTestClient) -> None:
    response = await client.get("/v1/tools", headers={**auth_for("alice"), "X-Request-ID": "trace-abc.123"})
    assert response.headers["x-request-id"] == "trace-abc.123"


async def test_a_malformed_request_id_is_replaced_by_a_generated_one(client: AsyncTestClient) -> None:
    response = await client.get("/v1/runs/nope", headers={**auth_for("alice"), "X-Request-ID": "bad id\twith junk"})
    generated = response.headers["x-request-id"]
    assert re.fullmatch(r"req_[0-9a-f]{32}", generated)
    assert response.json()["error"]["request_id"] == generated


async def test_metrics_count_calls_outcomes_and_rejections(client: AsyncTestClient) -> None:
    before = await scrape(client)
    run = await new_run(client, max_tool_calls=2)
    response = await client.post(
        f"/v1/runs/{run}/tool-calls",
        json=batch(
            tool_call("add", {"a": 1, "b": 2}),
            tool_call("create_article", {"title": "t", "body": "b"}),  # alice may not write
            tool_call("no_such_tool_" + run, {}),
            tool_call("add", {"a": 2, "b": 3}),
            tool_call("add", {"a": 3, "b": 4}),  # over the budget of 2
        ),
        headers=auth_for("alice"),
    )
    assert [outcome(c) for c in contents(response.json())] == [
        "OK", "PERMISSION_DENIED", "TOOL_NOT_FOUND", "OK", "BUDGET_EXCEEDED"
    ]
    forbidden = await client.get("/v1/admin/approvals", headers=auth_for("alice"))
    assert forbidden.status_code == 403
    after = await scrape(client)
    delta = growth(before, after)

    assert delta("gateway_tool_calls_total", tool="add", outcome="OK") == 2
    assert delta("gateway_tool_calls_total", tool="add", outcome="BUDGET_EXCEEDED") == 1
    assert delta("gateway_tool_calls_total", tool="create_article", outcome="PERMISSION_DENIED") == 1
    assert delta("gateway_tool_calls_total", tool="_unknown", outcome="TOOL_NOT_FOUND") == 1
    assert delta("gateway_tool_call_duration_seconds_count", tool="add") == 2
    assert delta("gateway_rejections_total", code="BUDGET_EXCEEDED") == 1
    assert delta("gateway_rejections_total", code="PERMISSION_DENIED") == 1
    assert delta("gateway_rejections_total", code="FORBIDDEN") == 1
    assert delta("gateway_http_errors_total", code="FORBIDDEN") == 1
    assert delta("gateway_tool_call_requests_total") == 1
    assert delta("gateway_stage_seconds_total", stage="budget") > 0
    assert value(after, "gateway_database_up") == 1


async def test_metrics_follow_approvals_from_request_to_decision(client: AsyncTestClient) -> None:
    before = await scrape(client)
    run = await new_run(client, user="bob")
    response = await client.post(
        f"/v1/runs/{run}/tool-calls",
        json=batch(tool_call("create_article", {"title": "Metrics", "body": "Counted."})),
        headers=auth_for("bob"),
    )
    approval_id = contents(response.json())[0]["error"]["approval_id"]
    pending = await scrape(client)
    decided = await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert decided.status_code == 200, decided.text
    after = await scrape(client)

    assert value(pending, "gateway_approvals_requested_total", tool="create_article") - value(
        before, "gateway_approvals_requested_total", tool="create_article"
    ) == 1
    assert value(pending, "gateway_approvals_pending", tenant="acme") == 1
    assert value(after, "gateway_approvals_pending", tenant="acme") == 0
    assert value(after, "gateway_approvals_decided_total", decision="approved") - value(
        before, "gateway_approvals_decided_total", decision="approved"
    ) == 1


async def test_model_call_metrics_record_latency_and_tokens(client: AsyncTestClient) -> None:
    before = await scrape(client)
    metrics = services_of(client.app).metrics
    metrics.model_call(model="test-model", duration_s=0.42, prompt_tokens=120, completion_tokens=30)
    metrics.model_call(model="test-model", duration_s=2.0, outcome="timeout")
    after = await scrape(client)
    delta = growth(before, after)

    assert delta("gateway_model_request_duration_seconds_count", model="test-model", outcome="ok") == 1
    assert delta("gateway_model_request_duration_seconds_count", model="test-model", outcome="timeout") == 1
    assert delta("gateway_model_tokens_total", model="test-model", kind="prompt") == 120
    assert delta("gateway_model_tokens_total", model="test-model", kind="completion") == 30
