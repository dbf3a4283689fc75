"""The console's webhooks page over HTTP: the tenant's webhooks, the form that adds one and
shows its secret once, deletion after a confirmation, and the dead letters with their retry
button, all through WebhookService (its checks and audit rows), only for holders of
webhooks:manage. PostgreSQL, the app's own delivery worker and a real loopback receiver."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from tests.support import db
from tests.support.approvals import request_approval
from tests.support.calls import create_run
from tests.support.console import page_csrf, sign_in
from tests.support.tokens import auth_for
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.probe_tools

CAROL = auth_for("carol")
BOB = auth_for("bob")
PAGE = "/console/webhooks"
FAST_WORKER = {
    "webhook_allowed_hosts": ("127.0.0.1",),
    "webhook_interval_s": 0.05,
    "webhook_timeout_s": 0.3,
    "webhook_retry_window_s": 0.6,
    "webhook_retry_base_s": 0.05,
    "webhook_retry_max_s": 0.1,
}
SECRET = re.compile(r"whsec_[A-Za-z0-9+/=]+")


@pytest.fixture(autouse=True)
def no_redirects(pg_client):
    pg_client.follow_redirects = False


async def api_create(client, url: str = "https://hooks.example.com/acme", headers=CAROL, **fields) -> dict:
    response = await client.post(
        "/v1/admin/webhooks", json={"url": url, "events": ["approval.created"], **fields}, headers=headers
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


async def api_list(client, headers=CAROL) -> list[dict]:
    return list((await client.get("/v1/admin/webhooks", headers=headers)).json()["items"])


def form(csrf: str, url: str = "https://hooks.example.com/ops", events=("approval.created",), **fields: str):
    return {"csrf_token": csrf, "url": url, **{f"event.{event}": "on" for event in events}, **fields}


async def wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("the condition was not met in time")
        await asyncio.sleep(0.05)


async def test_members_and_approvers_get_the_403_page_and_no_navigation_entry(pg_client):
    await sign_in(pg_client, "dave")
    approvals = await pg_client.get("/console/approvals")
    assert approvals.status_code == 200 and 'href="/console/webhooks"' not in approvals.text
    refused = await pg_client.get(PAGE)
    assert refused.status_code == 403 and "webhooks:manage" in refused.text
    csrf = await page_csrf(pg_client)
    posted = await pg_client.post(PAGE, data=form(csrf))
    assert posted.status_code == 403 and "webhooks:manage" in posted.text
    assert await api_list(pg_client) == []
    pg_client.cookies.clear()
    await sign_in(pg_client, "alice")
    assert (await pg_client.get(PAGE)).status_code == 403


async def test_an_admin_sees_the_tenants_webhooks_and_the_navigation_entry(pg_client):
    acme = await api_create(pg_client, "https://hooks.example.com/acme/T0/B1", format="slack", description="ops room")
    globex = await api_create(pg_client, "https://hooks.example.com/globex", headers=auth_for("carol", tenant="globex"))
    await sign_in(pg_client)
    response = await pg_client.get(PAGE)
    assert response.status_code == 200 and 'href="/console/webhooks" aria-current="page"' in response.text
    (row,) = re.findall(r'<tr data-webhook-id="([^"]+)">(.*?)</tr>', response.text, re.S)
    assert row[0] == acme["id"]
    for shown in ("https://hooks.example.com/acme/T0/B1", "approval.created", "slack", "ops room", "by carol"):
        assert shown in row[1], shown
    assert globex["id"] not in response.text


@pytest.mark.parametrize("settings_overrides", [{"log_level": "INFO"}])
async def test_the_form_shows_the_secret_once_and_the_list_never(pg_client, seeded_pg_url, logs):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, PAGE)
    answer = await pg_client.post(PAGE, data=form(csrf, events=("approval.created", "run.stopped"),
                                                  format="slack", description="ops room"))
    assert answer.status_code == 201, answer.text
    assert answer.headers["cache-control"] == "no-store" and "location" not in answer.headers
    (secret,) = set(SECRET.findall(answer.text))
    (made,) = await api_list(pg_client)
    assert (made["url"], made["events"], made["format"], made["description"], made["created_by"]) == (
        "https://hooks.example.com/ops", ["approval.created", "run.stopped"], "slack", "ops room", "carol")
    assert made["id"] in answer.text
    listed = await pg_client.get(PAGE)
    assert made["id"] in listed.text and secret not in listed.text and "whsec_" not in listed.text
    assert secret not in logs.text and logs.named("webhook_created")
    (audit,) = await db.audit_rows(seeded_pg_url, kind="admin_change")
    assert audit.user_id == "carol" and audit.detail["action"] == "webhook.create"
    assert secret not in str(audit.detail)


async def test_a_refused_url_is_explained_on_the_form_and_nothing_is_made(pg_client):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, PAGE)
    for url in ("https://127.0.0.1/x", "http://hooks.example.com/x", "https://user:pw@hooks.example.com/x"):
        response = await pg_client.post(PAGE, data=form(csrf, url=url, description="kept"))
        assert response.status_code == 400, url
        assert 'id="webhook-error"' in response.text and "The URL was refused" in response.text
        assert 'value="kept"' in response.text  # what was typed is shown again
    assert await api_list(pg_client) == []


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"events": ()}, "Choose at least one event"),
        ({"url": ""}, "Give the URL"),
        ({"url": "https://hooks.example.com/" + "a" * 3000}, "longer than 2000"),
        ({"format": "teams"}, "Choose the format"),
        ({"description": "d" * 600}, "longer than 500"),
        ({"secret": "whsec_mine"}, "a field this console does not send"),
        ({"event.approval.eaten": "on"}, "a field this console does not send"),
    ],
    ids=["no-events", "no-url", "long-url", "format", "long-description", "own-secret", "unknown-event"],
)
async def test_a_form_that_cannot_be_a_webhook_is_explained_in_words(pg_client, fields, words):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, PAGE)
    fields = dict(fields)
    events = fields.pop("events", ("approval.created",))
    data = form(csrf, events=events, **fields)
    response = await pg_client.post(PAGE, data=data)
    assert response.status_code == 400 and words in response.text
    assert await api_list(pg_client) == []


async def test_hostile_fields_are_refused_without_a_500_and_nothing_is_made(pg_client):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, PAGE)
    for fields in ({"url": "https://hooks.example.com/\x00"}, {"description": "a\x00b"},
                   {"url": "https://hooks.example.com/" + "a" * 20_000}, {"description": "d" * 20_000}):
        response = await pg_client.post(PAGE, data=form(csrf, **fields))
        assert response.status_code == 403 and "text/html" in response.headers["content-type"], fields
    doubled = await pg_client.post(
        PAGE, content=f"csrf_token={csrf}&url=https://a.example.com/&url=https://b.example.com/&event.run.stopped=on",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert doubled.status_code == 403
    assert await api_list(pg_client) == []


async def test_delete_asks_for_confirmation_then_deletes_and_is_audited(pg_client, seeded_pg_url):
    made = await api_create(pg_client)
    await sign_in(pg_client)
    listed = await pg_client.get(PAGE)
    assert f'href="/console/webhooks/{made["id"]}/delete"' in listed.text
    confirm = await pg_client.get(f"{PAGE}/{made['id']}/delete")
    assert confirm.status_code == 200 and "https://hooks.example.com/acme" in confirm.text
    assert f'action="/console/webhooks/{made["id"]}/delete"' in confirm.text
    assert len(await api_list(pg_client)) == 1  # the confirmation page alone deletes nothing
    csrf = await page_csrf(pg_client, f"{PAGE}/{made['id']}/delete")
    deleted = await pg_client.post(f"{PAGE}/{made['id']}/delete", data={"csrf_token": csrf})
    assert deleted.status_code == 303 and deleted.headers["location"] == "/console/webhooks?done=deleted"
    after = await pg_client.get(deleted.headers["location"])
    assert "The webhook was deleted" in after.text and made["id"] not in after.text
    assert await api_list(pg_client) == []
    actions = [row.detail["action"] for row in await db.audit_rows(seeded_pg_url, kind="admin_change")]
    assert actions.count("webhook.delete") == 1
    again = await pg_client.post(f"{PAGE}/{made['id']}/delete", data={"csrf_token": csrf})
    assert again.status_code == 404 and "text/html" in again.headers["content-type"]


@pytest.mark.parametrize("webhook_id", ["whs_nope", "bad%00id", "x" * 300, "%E2%80%AE", "a.b"])
async def test_unknown_or_malformed_ids_are_a_404_page(pg_client, webhook_id):
    await sign_in(pg_client)
    csrf = await page_csrf(pg_client, PAGE)
    shown = await pg_client.get(f"{PAGE}/{webhook_id}/delete")
    assert shown.status_code == 404 and "Not found" in shown.text
    for path in (f"{PAGE}/{webhook_id}/delete", f"{PAGE}/{webhook_id}/deliveries/msg_nope/retry",
                 f"{PAGE}/whs_x/deliveries/{webhook_id}/retry"):
        posted = await pg_client.post(path, data={"csrf_token": csrf})
        assert posted.status_code == 404 and "text/html" in posted.headers["content-type"], path


async def test_another_tenants_webhook_is_a_404_page_and_stays(pg_client):
    made = await api_create(pg_client)
    await sign_in(pg_client, "carol", tenant="globex")
    csrf = await page_csrf(pg_client, PAGE)
    assert made["id"] not in (await pg_client.get(PAGE)).text
    assert (await pg_client.get(f"{PAGE}/{made['id']}/delete")).status_code == 404
    deleted = await pg_client.post(f"{PAGE}/{made['id']}/delete", data={"csrf_token": csrf})
    assert deleted.status_code == 404 and "Not found" in deleted.text
    retried = await pg_client.post(f"{PAGE}/{made['id']}/deliveries/msg_x/retry", data={"csrf_token": csrf})
    assert retried.status_code == 404
    assert [item["id"] for item in await api_list(pg_client)] == [made["id"]]


async def test_posts_without_the_csrf_token_are_refused_and_change_nothing(pg_client):
    made = await api_create(pg_client)
    await sign_in(pg_client)
    for path, data in (
        (PAGE, {"url": "https://hooks.example.com/forged", "event.run.stopped": "on"}),
        (f"{PAGE}/{made['id']}/delete", {}),
        (f"{PAGE}/{made['id']}/deliveries/msg_x/retry", {"csrf_token": "x" * 43}),
    ):
        response = await pg_client.post(path, data=data)
        assert response.status_code == 403 and "did not come from this console" in response.text, path
    assert [item["id"] for item in await api_list(pg_client)] == [made["id"]]


async def test_the_pages_message_comes_from_a_fixed_list_never_from_the_query(pg_client):
    await sign_in(pg_client)
    for params in ({"done": "<b>owned</b>"}, {"done": "a\x00b"}, {"retried": "<script>x</script>"},
                   {"retried": "r" * 5000}, {"retried": "msg\x00"}):
        response = await pg_client.get(PAGE, params=params)
        assert response.status_code in (200, 400), params  # a NUL is refused at the edge, before the page
        assert 'id="webhooks-done"' not in response.text and "owned" not in response.text and "<script" not in response.text


async def test_options_and_head_on_the_webhook_pages_never_fail(pg_client):
    made = await api_create(pg_client)
    for path in (PAGE, f"{PAGE}/{made['id']}/delete"):
        assert (await pg_client.options(path)).status_code < 500, path
        assert (await pg_client.head(path)).status_code < 500, path


@pytest.mark.parametrize("settings_overrides", [FAST_WORKER])
async def test_the_retry_button_requeues_a_dead_lettered_delivery_and_it_is_delivered(pg_client, seeded_pg_url):
    async with WebhookReceiver(behaviour=lambda n, _: "fail") as receiver:
        made = await api_create(pg_client, receiver.url)
        run = await create_run(pg_client, BOB)
        await request_approval(pg_client, run["id"], BOB, "w1", "write_note", {"text": "hi"})
        deliveries = f"/v1/admin/webhooks/{made['id']}/deliveries"

        async def in_state(state: str):
            return (await pg_client.get(deliveries, params={"state": state}, headers=CAROL)).json()["items"]

        (dead,) = await wait_for(lambda: in_state("dead"))
        await sign_in(pg_client)
        listed = await pg_client.get(PAGE)
        (row,) = re.findall(r'<tr data-delivery-id="([^"]+)">(.*?)</tr>', listed.text, re.S)
        assert row[0] == dead["id"]
        for shown in ("approval.created", made["id"], "http_500", "HTTP 500", f'data-label="Attempts">{dead["attempts"]}</td>'):
            assert shown in row[1], shown
        retry = f"{PAGE}/{made['id']}/deliveries/{dead['id']}/retry"
        assert f'action="{retry}"' in row[1]

        receiver.behaviour = lambda n, _: "ok"
        csrf = await page_csrf(pg_client, PAGE)
        answer = await pg_client.post(retry, data={"csrf_token": csrf})
        assert answer.status_code == 303 and answer.headers["location"] == f"{PAGE}?retried={dead['id']}"
        shown = await pg_client.get(answer.headers["location"])
        assert f"The delivery {dead['id']} is queued again" in shown.text
        (delivered,) = await wait_for(lambda: in_state("delivered"))
        assert delivered["id"] == dead["id"] and receiver.requests[-1].headers["webhook-id"] == dead["id"]
        assert "No delivery is dead-lettered" in (await pg_client.get(PAGE)).text

        again = await pg_client.post(retry, data={"csrf_token": csrf})
        assert again.status_code == 409 and 'id="retry-error"' in again.text
        assert "Only a dead-lettered delivery can be retried" in again.text
    retries = [row for row in await db.audit_rows(seeded_pg_url, kind="admin_change")
               if row.detail["action"] == "webhook.retry"]
    assert [(row.user_id, row.detail["target"]) for row in retries] == [("carol", f"webhook_delivery:{dead['id']}")]
