"""Two `gateway serve` processes sending one outbox: under normal operation each event
reaches the receiver once, and the `gateway webhooks` command manages the same webhooks.
Real processes on one PostgreSQL, a real receiver on a loopback port."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from tests.integration.test_webhooks_delivery import insert_approval
from tests.support.db import open_database
from tests.support.processes import gateways, run_cli
from tests.support.tokens import auth_for
from tests.support.webhook_receiver import WebhookReceiver, verify_standard_webhook

pytestmark = pytest.mark.postgres

EVENTS = 30


async def test_two_processes_deliver_each_event_once(seeded_pg_url):
    async with WebhookReceiver() as receiver:
        with gateways(seeded_pg_url, 2, webhook_allowed_hosts="127.0.0.1", webhook_interval_s=0.05,
                      webhook_batch_size=4) as (first, second):
            async with httpx.AsyncClient(timeout=10) as client:
                created = await client.post(
                    first.url + "/v1/admin/webhooks", headers=auth_for("carol"),
                    json={"url": receiver.url, "events": ["approval.created"]},
                )
            assert created.status_code == 201, created.text
            secret = created.json()["secret"]
            async with open_database(seeded_pg_url) as db:
                for _ in range(EVENTS // 3):
                    async with db.begin() as conn:
                        for _ in range(3):
                            await insert_approval(conn)
            await receiver.wait_for(EVENTS, timeout=30)
            await asyncio.sleep(0.5)  # long enough for a second copy to arrive, if one were sent
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == EVENTS and len(set(ids)) == EVENTS
    assert all(verify_standard_webhook(secret, r.headers, r.body) for r in receiver.requests)
    approvals = {r.json()["data"]["approval_id"] for r in receiver.requests}
    assert len(approvals) == EVENTS


def test_the_webhooks_command_creates_lists_shows_deliveries_and_deletes(seeded_pg_url):
    made = run_cli(seeded_pg_url, "webhooks", "create", "--tenant", "acme", "--url", "https://hooks.example.com/a",
                   "--event", "approval.created", "--event", "run.stopped", "--format", "slack")
    assert made.returncode == 0, made.stderr
    secret = re.search(r"whsec_[A-Za-z0-9+/=]+", made.stdout)
    assert secret is not None
    webhook_id = made.stdout.split()[1]
    listed = run_cli(seeded_pg_url, "webhooks", "list", "--tenant", "acme")
    assert listed.returncode == 0 and webhook_id in listed.stdout and "approval.created,run.stopped" in listed.stdout
    assert secret.group() not in listed.stdout + listed.stderr
    deliveries = run_cli(seeded_pg_url, "webhooks", "deliveries", "--tenant", "acme", webhook_id, "--state", "dead")
    assert (deliveries.returncode, deliveries.stdout.strip()) == (0, "no deliveries")
    refused = run_cli(seeded_pg_url, "webhooks", "create", "--tenant", "acme", "--url", "http://10.0.0.1/x",
                      "--event", "approval.created")
    assert refused.returncode == 1 and "https" in refused.stderr
    missing = run_cli(seeded_pg_url, "webhooks", "retry", "--tenant", "acme", "msg_nope")
    assert missing.returncode == 1 and "No such delivery" in missing.stderr
    deleted = run_cli(seeded_pg_url, "webhooks", "delete", "--tenant", "acme", webhook_id)
    assert deleted.returncode == 0
    assert run_cli(seeded_pg_url, "webhooks", "list", "--tenant", "acme").stdout.strip() == "tenant acme has no webhooks"


@pytest.mark.parametrize("url", ["https://xn--zz/", "https://xn--a-ecp.ru/hook", "https://" + "a" * 64 + ".com/"])
def test_the_webhooks_command_refuses_a_host_that_is_not_a_valid_name_without_a_traceback(seeded_pg_url, url):
    refused = run_cli(seeded_pg_url, "webhooks", "create", "--tenant", "acme", "--url", url,
                      "--event", "approval.created")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "gateway: The URL's host is not a valid name."
    assert run_cli(seeded_pg_url, "webhooks", "list", "--tenant", "acme").stdout.strip() == "tenant acme has no webhooks"
