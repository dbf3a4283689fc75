"""`run.stopped` from a real agent run: a scripted model loops until the run's max_steps, the
loop stores its end state, and the app's own worker announces it to a loopback receiver."""

from __future__ import annotations

import itertools
from typing import Any

from tests.agent.conftest import agent_settings, running_gateway, served_model
from tests.support.scripted_model import Turn, call, openai_turn
from tests.support.tokens import auth_for
from tests.support.webhook_receiver import WebhookReceiver, verify_standard_webhook

_ids = itertools.count()


def same_call_forever(request: dict[str, Any]) -> Turn:
    return openai_turn(calls=[call("add", {"a": 1, "b": 1}, f"call_{next(_ids)}")])


async def test_an_agent_run_stopped_at_its_step_limit_is_announced(pg_url):
    async with served_model() as model, WebhookReceiver() as receiver:
        settings = agent_settings(pg_url, model.url, webhook_allowed_hosts=("127.0.0.1",), webhook_interval_s=0.05)
        async with running_gateway(pg_url, settings) as gateway:
            created = await gateway.http.post(
                "/v1/admin/webhooks", headers=auth_for("carol"),
                json={"url": receiver.url, "events": ["run.stopped"]},
            )
            assert created.status_code == 201, created.text
            model.script(same_call_forever)
            response = await gateway.chat("add 1 and 1", gateway={"max_steps": 3})
            assert response.status_code == 200, response.text
            run_id = response.json()["gateway"]["run_id"]
            (request,) = await receiver.wait_for(1)
    assert verify_standard_webhook(created.json()["secret"], request.headers, request.body)
    body = request.json()
    assert body["type"] == "run.stopped"
    data = body["data"]
    assert (data["run_id"], data["user_id"], data["state"], data["stop_reason"]) == (
        run_id, "alice", "stopped", "MAX_STEPS_EXCEEDED")
    assert data["steps"] == 3
