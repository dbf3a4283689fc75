"""Every round trip to a model is counted: its latency by outcome, and the tokens it reported."""

from __future__ import annotations

from tests.support.prometheus import growth, samples
from tests.support.scripted_model import Turn, openai_turn


async def scrape(gateway) -> dict:
    response = await gateway.http.get("/metrics")
    assert response.status_code == 200
    return samples(response.text)


async def test_an_answered_round_trip_records_its_latency_and_tokens(gateway, model):
    model.script(openai_turn("Hello.", prompt_tokens=31, completion_tokens=7))
    before = await scrape(gateway)
    response = await gateway.chat("hello")
    assert response.status_code == 200, response.text
    delta = growth(before, await scrape(gateway))

    assert delta("gateway_model_request_duration_seconds_count", model="scripted-model", outcome="ok") == 1
    assert delta("gateway_model_request_duration_seconds_sum", model="scripted-model", outcome="ok") > 0
    assert delta("gateway_model_tokens_total", model="scripted-model", kind="prompt") == 31
    assert delta("gateway_model_tokens_total", model="scripted-model", kind="completion") == 7


async def test_a_failed_round_trip_records_its_outcome_once_and_no_tokens(gateway, model):
    model.script(Turn(status=503, body={"error": "overloaded"}))
    before = await scrape(gateway)
    response = await gateway.chat("hello")
    assert response.status_code == 502, response.text
    delta = growth(before, await scrape(gateway))

    # One round trip of the loop, its retries included.
    assert delta("gateway_model_request_duration_seconds_count", model="scripted-model", outcome="unavailable") == 1
    assert delta("gateway_model_request_duration_seconds_count", model="scripted-model", outcome="ok") == 0
    assert delta("gateway_model_tokens_total", model="scripted-model", kind="prompt") == 0


async def test_a_malformed_answer_is_recorded_as_a_bad_response(gateway, model):
    model.script(Turn(body=b"{not json"))
    before = await scrape(gateway)
    response = await gateway.chat("hello")
    assert response.status_code == 502, response.text
    delta = growth(before, await scrape(gateway))

    assert delta("gateway_model_request_duration_seconds_count", model="scripted-model", outcome="bad_response") == 1
