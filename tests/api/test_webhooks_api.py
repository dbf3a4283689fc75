"""The webhooks admin API (/v1/admin/webhooks, permission webhooks:manage): the secret shown
once, the URL rules at creation, deliveries with their dead-letter state and a retry that
delivers — through the app's own delivery worker. PostgreSQL, real loopback receivers."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support import db
from tests.support.approvals import approve, request_approval
from tests.support.calls import create_run
from tests.support.http import assert_error
from tests.support.tokens import auth_for
from tests.support.webhook_receiver import WebhookReceiver, verify_standard_webhook

pytestmark = pytest.mark.probe_tools

CAROL = auth_for("carol")
BOB = auth_for("bob")
GLOBEX_CAROL = auth_for("carol", tenant="globex")
FAST_WORKER = {
    "webhook_allowed_hosts": ("127.0.0.1",),
    "webhook_interval_s": 0.05,
    "webhook_timeout_s": 0.3,
    "webhook_retry_window_s": 0.6,
    "webhook_retry_base_s": 0.05,
    "webhook_retry_max_s": 0.1,
}
ALLOW_LOOPBACK = {"webhook_allowed_hosts": ("127.0.0.1",), "webhook_interval_s": 0}


async def _create(client, url: str, events=("approval.created",), headers=CAROL, **fields):
    return await client.post("/v1/admin/webhooks", json={"url": url, "events": list(events), **fields},
                             headers=headers)


async def _wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("the condition was not met in time")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("settings_overrides", [ALLOW_LOOPBACK])
async def test_the_secret_is_answered_once_and_never_again_nor_logged_nor_audited(pg_client, seeded_pg_url, logs):
    created = await _create(pg_client, "http://127.0.0.1:9/hook", description="ops channel")
    assert created.status_code == 201, created.text
    assert created.headers["cache-control"] == "no-store"
    body = created.json()
    secret = body["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    assert (body["url"], body["events"], body["format"], body["created_by"]) == (
        "http://127.0.0.1:9/hook", ["approval.created"], "standard", "carol")
    listed = await pg_client.get("/v1/admin/webhooks", headers=CAROL)
    read = await pg_client.get(f"/v1/admin/webhooks/{body['id']}", headers=CAROL)
    assert listed.status_code == read.status_code == 200
    assert [item["id"] for item in listed.json()["items"]] == [body["id"]]
    assert "secret" not in read.json() and "secret" not in listed.json()["items"][0]
    assert secret not in listed.text + read.text
    assert secret not in logs.text and logs.named("webhook_created")
    audit = await db.audit_rows(seeded_pg_url, kind="admin_change")
    assert any(row.detail["action"] == "webhook.create" for row in audit)
    assert secret not in str([row.detail for row in audit])


async def test_every_webhook_route_needs_webhooks_manage(pg_client):
    for user in ("alice", "bob"):
        headers = auth_for(user)
        assert_error(await pg_client.get("/v1/admin/webhooks", headers=headers), 403, "FORBIDDEN")
        assert_error(await _create(pg_client, "https://hooks.example.com/x", headers=headers), 403, "FORBIDDEN")
        assert_error(await pg_client.delete("/v1/admin/webhooks/whs_1", headers=headers), 403, "FORBIDDEN")
    assert_error(await pg_client.get("/v1/admin/webhooks"), 401, "UNAUTHENTICATED")


async def test_another_tenants_webhook_is_not_found(pg_client):
    created = (await _create(pg_client, "https://hooks.example.com/acme")).json()
    for response in (
        await pg_client.get(f"/v1/admin/webhooks/{created['id']}", headers=GLOBEX_CAROL),
        await pg_client.get(f"/v1/admin/webhooks/{created['id']}/deliveries", headers=GLOBEX_CAROL),
        await pg_client.delete(f"/v1/admin/webhooks/{created['id']}", headers=GLOBEX_CAROL),
    ):
        assert_error(response, 404, "NOT_FOUND")
    assert (await pg_client.get("/v1/admin/webhooks", headers=GLOBEX_CAROL)).json() == {"items": []}


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example.com/x",  # plain http to a host not allow-listed
        "https://127.0.0.1/x",  # loopback
        "https://[::1]/x",
        "https://10.1.2.3/x",  # private
        "https://169.254.169.254/latest",  # link-local (cloud metadata)
        "https://[::ffff:127.0.0.1]/x",  # loopback behind an IPv4-mapped address
        "https://localhost:8443/x",
        "https://user:pass@hooks.example.com/x",  # credentials
        "ftp://hooks.example.com/x",
        "https://hooks.example.com/x y",
        "https://",
    ],
)
async def test_urls_breaking_the_outbound_rules_are_refused_with_a_stable_code(pg_client, url):
    assert_error(await _create(pg_client, url), 400, "WEBHOOK_URL_REFUSED")
    assert (await pg_client.get("/v1/admin/webhooks", headers=CAROL)).json() == {"items": []}


@pytest.mark.parametrize(
    "url",
    [
        "https://xn--zz/",
        "https://xn--/",
        "https://xn--a-ecp.ru/hook",
        "https://XN--ZZ.example.com/hook",
        "https://" + "a" * 64 + ".example.com/hook",
    ],
)
async def test_a_host_that_is_not_a_valid_name_is_refused_not_an_internal_error(pg_client, url):
    error = assert_error(await _create(pg_client, url), 400, "WEBHOOK_URL_REFUSED")
    assert error["message"] == "The URL's host is not a valid name."
    assert (await pg_client.get("/v1/admin/webhooks", headers=CAROL)).json() == {"items": []}


async def test_loopback_over_http_is_refused_unless_allow_listed(pg_client):
    assert_error(await _create(pg_client, "http://127.0.0.1:9/hook"), 400, "WEBHOOK_URL_REFUSED")


@pytest.mark.parametrize("settings_overrides", [ALLOW_LOOPBACK])
async def test_an_allow_listed_loopback_host_is_accepted(pg_client):
    assert (await _create(pg_client, "http://127.0.0.1:9/hook")).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        {"url": "https://hooks.example.com/x", "events": []},
        {"url": "https://hooks.example.com/x", "events": ["approval.eaten"]},
        {"url": "https://hooks.example.com/x", "events": ["approval.created"], "format": "teams"},
        {"url": "https://hooks.example.com/x", "events": ["approval.created"], "secret": "whsec_mine"},
        {"url": 7, "events": ["approval.created"]},
        {"url": "https://hooks.example.com/\u0000", "events": ["approval.created"]},  # NUL: refused at the edge
        {"url": "https://hooks.example.com/" + "a" * 3000, "events": ["approval.created"]},
    ],
)
async def test_a_malformed_subscription_is_invalid_request(pg_client, body):
    assert_error(await pg_client.post("/v1/admin/webhooks", json=body, headers=CAROL), 400, "INVALID_REQUEST")


async def test_the_audit_keeps_a_urls_origin_and_hash_not_its_path_which_may_be_a_credential(
    pg_client, seeded_pg_url
):
    """A Slack incoming-webhook URL is itself a credential: holders of audit:read (who need not
    hold webhooks:manage) must not read it from the audit."""
    url = "https://hooks.slack.com/services/T000/B000/CredentialPart?token=QueryPart"
    created = (await _create(pg_client, url)).json()
    assert (await pg_client.delete(f"/v1/admin/webhooks/{created['id']}", headers=CAROL)).status_code == 204
    rows = [row for row in await db.audit_rows(seeded_pg_url, kind="admin_change")
            if row.detail["action"] in ("webhook.create", "webhook.delete")]
    assert len(rows) == 2
    assert "CredentialPart" not in str([row.detail for row in rows]) and "QueryPart" not in str([row.detail for row in rows])
    assert "https://hooks.slack.com" in str([row.detail for row in rows])


async def test_delete_removes_the_webhook(pg_client):
    created = (await _create(pg_client, "https://hooks.example.com/x")).json()
    assert (await pg_client.delete(f"/v1/admin/webhooks/{created['id']}", headers=CAROL)).status_code == 204
    assert_error(await pg_client.get(f"/v1/admin/webhooks/{created['id']}", headers=CAROL), 404, "NOT_FOUND")
    assert_error(await pg_client.delete(f"/v1/admin/webhooks/{created['id']}", headers=CAROL), 404, "NOT_FOUND")


@pytest.mark.parametrize("settings_overrides", [FAST_WORKER])
async def test_a_dead_lettered_delivery_is_listed_and_a_retry_from_the_api_delivers_it(pg_client):
    async with WebhookReceiver(behaviour=lambda n, _: "hang") as receiver:
        created = (await _create(pg_client, receiver.url)).json()
        run = await create_run(pg_client, BOB)
        approval_id = await request_approval(pg_client, run["id"], BOB, "w1", "write_note", {"text": "hi"})
        deliveries_url = f"/v1/admin/webhooks/{created['id']}/deliveries"

        async def dead():
            items = (await pg_client.get(deliveries_url, params={"state": "dead"}, headers=CAROL)).json()["items"]
            return items

        (item,) = await _wait_for(dead)
        assert (item["event_type"], item["last_error"], item["webhook_id"]) == (
            "approval.created", "timeout", created["id"])
        assert item["attempts"] == len(receiver.requests) >= 2
        receiver.behaviour = lambda n, _: "ok"
        retried = await pg_client.post(f"{deliveries_url}/{item['id']}/retry", headers=CAROL)
        assert retried.status_code == 200, retried.text
        assert retried.json()["state"] == "pending"

        async def delivered():
            items = (await pg_client.get(deliveries_url, params={"state": "delivered"}, headers=CAROL)).json()
            return items["items"]

        (done,) = await _wait_for(delivered)
        assert done["id"] == item["id"] and done["last_status"] == 204
        last = receiver.requests[-1]
        assert last.headers["webhook-id"] == item["id"]
        assert verify_standard_webhook(created["secret"], last.headers, last.body)
        assert last.json()["data"]["approval_id"] == approval_id
        assert_error(await pg_client.post(f"{deliveries_url}/{item['id']}/retry", headers=CAROL), 409, "CONFLICT")


@pytest.mark.parametrize("settings_overrides", [{**FAST_WORKER, "webhook_timeout_s": 5.0}])
async def test_an_approval_decided_through_the_api_is_announced_and_the_secret_stays_out_of_the_logs(
    pg_client, logs
):
    async with WebhookReceiver() as receiver:
        created = (await _create(pg_client, receiver.url, events=["approval.decided"])).json()
        run = await create_run(pg_client, BOB)
        approval_id = await request_approval(pg_client, run["id"], BOB, "w1", "write_note", {"text": "hi"})
        assert (await approve(pg_client, approval_id)).status_code == 200
        (request,) = await receiver.wait_for(1)
    assert verify_standard_webhook(created["secret"], request.headers, request.body)
    body = request.json()
    assert body["type"] == "approval.decided"
    assert (body["data"]["approval_id"], body["data"]["decision"], body["data"]["decided_by"]) == (
        approval_id, "approved", "carol")

    async def logged():
        return logs.named("webhook_delivered")

    (event,) = await _wait_for(logged)
    assert event["delivery"] == request.headers["webhook-id"] and event["status"] == 204
    assert created["secret"] not in logs.text and receiver.url not in logs.text


async def test_retrying_an_unknown_delivery_is_not_found_and_a_bad_state_filter_is_invalid(pg_client):
    created = (await _create(pg_client, "https://hooks.example.com/x")).json()
    base = f"/v1/admin/webhooks/{created['id']}/deliveries"
    assert_error(await pg_client.post(f"{base}/msg_nope/retry", headers=CAROL), 404, "NOT_FOUND")
    assert_error(await pg_client.get(base, params={"state": "exploded"}, headers=CAROL), 400, "INVALID_REQUEST")
    assert (await pg_client.get(base, headers=CAROL)).json() == {"items": []}
