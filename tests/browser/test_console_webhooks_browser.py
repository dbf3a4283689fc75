"""The console's webhooks page in a real browser (Chromium) against a real `gateway serve`: an
admin adds a webhook through the form, reads its secret once, and finds it in the list."""

from __future__ import annotations

import re
import uuid

import httpx
from playwright.sync_api import Page, expect

from tests.browser.test_console_browser import sign_in
from tests.support.processes import GatewayProcess
from tests.support.tokens import auth_for


def test_an_admin_adds_a_webhook_sees_its_secret_once_and_then_in_the_list(page: Page, gateway: GatewayProcess) -> None:
    url = f"https://hooks.example.com/{uuid.uuid4().hex[:8]}/incoming"
    sign_in(page, gateway)
    page.get_by_role("link", name="Webhooks").click()
    expect(page.get_by_role("heading", name="Webhooks", exact=True)).to_be_visible()
    page.get_by_label(re.compile(r"^URL")).fill(url)
    page.get_by_label("approval.created").check()
    page.get_by_label("approval.decided").check()
    page.get_by_label("Slack incoming webhook").check()
    page.get_by_label(re.compile(r"^Description")).fill("ops room")
    page.get_by_role("button", name="Add the webhook").click()

    expect(page.get_by_role("heading", name="Webhook added")).to_be_visible()
    secret = page.locator("#webhook-secret").inner_text().strip()
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/=]{40,}", secret), secret
    assert "whsec_" not in page.url and secret not in page.url

    page.get_by_role("link", name="← Webhooks").click()
    (made,) = [item for item in httpx.get(f"{gateway.url}/v1/admin/webhooks", headers=auth_for("carol"),
                                          timeout=10).json()["items"] if item["url"] == url]
    row = page.locator(f'tr[data-webhook-id="{made["id"]}"]')
    expect(row).to_contain_text(url)
    expect(row).to_contain_text("approval.created, approval.decided")
    expect(row).to_contain_text("slack")
    expect(row).to_contain_text("ops room")
    assert secret not in page.content()

    page.set_viewport_size({"width": 375, "height": 740})
    page.reload()
    expect(row).to_be_visible()
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
