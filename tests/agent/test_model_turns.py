"""Model requests take turns per tenant: a tenant's chats hold at most
GATEWAY_LLM_MAX_REQUESTS_PER_TENANT model connections at once, the rest wait their turn,
and another tenant's chat is answered meanwhile. A real model server on a loopback port."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.agent.conftest import agent_settings, running_gateway
from tests.support.loopback import serve
from tests.support.scripted_model import ScriptedModel, openai_turn


class CountingModel(ScriptedModel):
    """Counts the requests it is answering at once, by the tenant named in the prompt."""

    def __init__(self) -> None:
        super().__init__([self._answer])
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.release = asyncio.Event()

    def _answer(self, request: dict[str, Any]) -> Any:
        return openai_turn("done")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        tenant = "acme" if b"from acme" in body else "globex"
        self.in_flight[tenant] = self.in_flight.get(tenant, 0) + 1
        self.peak[tenant] = max(self.peak.get(tenant, 0), self.in_flight[tenant])
        try:
            if tenant == "acme":
                await self.release.wait()  # acme's answers come only once the test says so

            async def replay() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            await super().__call__(scope, replay, send)
        finally:
            self.in_flight[tenant] -= 1


async def test_a_tenants_chats_hold_at_most_their_turns_and_another_tenant_is_answered(pg_url):
    model = CountingModel()
    async with serve(model) as url:
        model.url = url
        settings = agent_settings(pg_url, url, llm_max_requests_per_tenant=2)
        async with running_gateway(pg_url, settings) as gateway:
            acme = [asyncio.create_task(gateway.chat("hello from acme")) for _ in range(5)]
            for _ in range(500):
                if model.in_flight.get("acme") == 2:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # room for a third, were there no turns
            assert model.in_flight["acme"] == 2 and not any(task.done() for task in acme)

            globex = await gateway.chat("hello from globex", tenant="globex")
            assert globex.status_code == 200, globex.text
            assert not any(task.done() for task in acme)

            model.release.set()
            answers = await asyncio.gather(*acme)
    assert [answer.status_code for answer in answers] == [200] * 5
    assert model.peak == {"acme": 2, "globex": 1}
