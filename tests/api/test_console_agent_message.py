"""An approval held back by the agent loop: its console page shows the requester's last
message to the assistant (the gateway and a scripted model are real loopback servers)."""

from __future__ import annotations

from tests.agent.conftest import agent_settings, running_gateway, served_model
from tests.support.approvals import request_approval
from tests.support.calls import create_run
from tests.support.console import sign_in
from tests.support.scripted_model import call, openai_turn
from tests.support.tokens import auth_for

MESSAGE = "Please publish the <b>Q3</b> numbers as an article"


async def test_the_detail_page_shows_the_requesters_last_message(pg_url):
    async with served_model() as model, running_gateway(pg_url, agent_settings(pg_url, model.url)) as gateway:
        model.script(openai_turn("Creating it.", calls=[call("create_article", {"title": "Q3", "body": "N"}, "c1")]))
        body = (await gateway.chat(MESSAGE, user="bob")).json()
        approval_id = body["gateway"]["stop_reason"]["approval_ids"][0]
        gateway.http.follow_redirects = False
        await sign_in(gateway.http)
        page = await gateway.http.get(f"/console/approvals/{approval_id}")
        assert page.status_code == 200
        assert "Please publish the &lt;b&gt;Q3&lt;/b&gt; numbers as an article" in page.text  # escaped, not markup
        assert "last message to the assistant" in page.text


async def test_a_call_made_outside_the_agent_loop_shows_no_message(pg_client):
    pg_client.follow_redirects = False
    run = await create_run(pg_client, auth_for("bob"))
    approval = await request_approval(pg_client, run["id"], auth_for("bob"), "x1", "create_article",
                                      {"title": "T", "body": "B"})
    await sign_in(pg_client)
    page = await pg_client.get(f"/console/approvals/{approval}")
    assert page.status_code == 200 and "last message to the assistant" not in page.text
