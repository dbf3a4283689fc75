"""The console in a real browser (Chromium) against a real `gateway serve`: sign in with a
token, see a pending approval made through the API, open it, approve or reject it, and the
refusals a browser can meet."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import BrowserContext, Page, expect

from tests.support.processes import GatewayProcess
from tests.support.tokens import auth_for, make_token

BOB = auth_for("bob")


def create_article_approval(gateway: GatewayProcess, title: str) -> str:
    """Bob asks for an article; the gateway holds the call back for an approver."""
    with httpx.Client(base_url=gateway.url, timeout=10, follow_redirects=False) as client:
        run = client.post("/v1/runs", json={}, headers=BOB)
        assert run.status_code == 201, run.text
        call = {"id": "c_" + uuid.uuid4().hex[:8], "type": "function",
                "function": {"name": "create_article", "arguments": f'{{"title": "{title}", "body": "Text of {title}"}}'}}
        answer = client.post(f"/v1/runs/{run.json()['id']}/tool-calls", json={"tool_calls": [call]}, headers=BOB)
        assert answer.status_code == 200, answer.text
        content = json.loads(answer.json()["messages"][0]["content"])
        assert content["error"]["code"] == "APPROVAL_REQUIRED", content
        return str(content["error"]["approval_id"])


def requester_view(gateway: GatewayProcess, approval_id: str) -> dict[str, Any]:
    response = httpx.get(f"{gateway.url}/v1/approvals/{approval_id}", headers=BOB, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def sign_in(page: Page, gateway: GatewayProcess, user: str = "carol") -> None:
    page.goto(f"{gateway.url}/console/")
    expect(page).to_have_url(re.compile(r"/console/sign-in$"))
    page.get_by_label("Access token").fill(make_token("acme", user))
    page.get_by_role("button", name="Sign in").click()


def test_token_sign_in_lands_on_the_approvals_page(page: Page, gateway: GatewayProcess) -> None:
    sign_in(page, gateway)
    expect(page).to_have_url(re.compile(r"/console/approvals$"))
    expect(page.get_by_role("heading", name="Approvals", exact=True)).to_be_visible()
    expect(page.get_by_text("carol · acme")).to_be_visible()


def test_a_pending_approval_appears_opens_with_its_exact_arguments_and_is_approved(
    page: Page, gateway: GatewayProcess
) -> None:
    title = "Quarterly " + uuid.uuid4().hex[:6]
    approval_id = create_article_approval(gateway, title)
    sign_in(page, gateway)
    row = page.locator(f'tr[data-approval-id="{approval_id}"]')
    expect(row).to_contain_text("create_article")
    expect(row).to_contain_text("bob")
    row.get_by_role("link", name=re.compile("Open")).click()
    expect(page.locator("#arguments")).to_contain_text(f'"title": "{title}"')
    expect(page.locator("#arguments")).to_contain_text(f'"body": "Text of {title}"')
    page.get_by_role("button", name="Approve and execute").click()
    expect(page.locator("#approval-status")).to_have_text("succeeded")
    view = requester_view(gateway, approval_id)
    assert view["status"] == "succeeded" and view["decided_by"] == "carol"
    assert view["outcome"]["ok"] is True and view["outcome"]["result"]["title"] == title


def test_an_approval_is_rejected_with_a_reason(page: Page, gateway: GatewayProcess) -> None:
    approval_id = create_article_approval(gateway, "Rejected " + uuid.uuid4().hex[:6])
    sign_in(page, gateway)
    page.goto(f"{gateway.url}/console/approvals/{approval_id}")
    page.get_by_label("Reason for rejecting").fill("Not this quarter")
    page.get_by_role("button", name="Reject").click()
    expect(page.locator("#approval-status")).to_have_text("rejected")
    view = requester_view(gateway, approval_id)
    assert view["status"] == "rejected" and view["reason"] == "Not this quarter"
    assert view["outcome"]["error"]["code"] == "APPROVAL_REJECTED"


def test_a_member_sees_the_403_page(page: Page, gateway: GatewayProcess) -> None:
    sign_in(page, gateway, "alice")
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("approvals:decide")


def test_a_form_posted_without_the_csrf_token_is_refused(page: Page, gateway: GatewayProcess) -> None:
    approval_id = create_article_approval(gateway, "Forged " + uuid.uuid4().hex[:6])
    sign_in(page, gateway)
    page.goto(f"{gateway.url}/console/approvals/{approval_id}")
    # The page's own form, its CSRF field taken out, submitted by the browser with the session cookie.
    page.locator('form[action$="/approve"] input[name="csrf_token"]').evaluate("field => field.remove()")
    page.get_by_role("button", name="Approve and execute").click()
    expect(page.get_by_role("heading", name="Form refused")).to_be_visible()
    assert requester_view(gateway, approval_id)["status"] == "pending"


def test_sign_out_ends_the_session_and_the_old_cookie_no_longer_works(
    context: BrowserContext, page: Page, gateway: GatewayProcess
) -> None:
    sign_in(page, gateway)
    (cookie,) = [c for c in context.cookies() if c["name"] == "gateway_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/console/sign-in$"))
    context.add_cookies([{key: cookie[key] for key in ("name", "value", "domain", "path")}])  # type: ignore[misc]
    page.goto(f"{gateway.url}/console/approvals")
    expect(page).to_have_url(re.compile(r"/console/sign-in$"))


def test_the_approvals_page_is_usable_375_pixels_wide(page: Page, gateway: GatewayProcess) -> None:
    create_article_approval(gateway, "Narrow " + uuid.uuid4().hex[:6])
    page.set_viewport_size({"width": 375, "height": 740})
    sign_in(page, gateway)
    expect(page.get_by_role("heading", name="Approvals", exact=True)).to_be_visible()
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"


def test_the_audit_page_filters_and_exports(context: BrowserContext, page: Page, gateway: GatewayProcess) -> None:
    approval_id = create_article_approval(gateway, "Audited " + uuid.uuid4().hex[:6])
    other_id = create_article_approval(gateway, "Other " + uuid.uuid4().hex[:6])
    sign_in(page, gateway)
    page.goto(f"{gateway.url}/console/approvals/{approval_id}")
    page.get_by_label("Reason for rejecting").fill("audit me")
    page.get_by_role("button", name="Reject").click()
    page.get_by_role("link", name="Audit").click()
    page.get_by_label("Approval id").fill(approval_id)
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#audit-rows tbody tr")
    expect(rows.first).to_contain_text("approval_decision")
    expect(page.locator("#audit-rows")).to_contain_text(approval_id)
    expect(page.locator("#audit-rows")).not_to_contain_text(other_id)
    with page.expect_download() as download:
        page.get_by_role("link", name="JSON Lines").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert lines and all(json.loads(line)["approval_id"] == approval_id for line in lines)
    with page.expect_download() as csv_download:
        page.get_by_role("link", name="CSV").click()
    csv_text = Path(csv_download.value.path()).read_text()
    assert csv_text.startswith("id,") and approval_id in csv_text and other_id not in csv_text
    page.get_by_role("link", name="Verify this tenant's audit chain").click()
    expect(page.locator("#verify-result")).to_contain_text("tenant acme: OK")


def test_the_tenant_page_changes_a_tool_policy_through_the_admin_service(page: Page, gateway: GatewayProcess) -> None:
    sign_in(page, gateway)
    page.get_by_role("link", name="Tenant").click()
    row = page.locator('tr[data-tool="multiply"]')
    row.get_by_label("Approval").select_option("always")
    row.get_by_role("button", name="Save").click()
    expect(page.locator('tr[data-tool="multiply"]')).to_contain_text("(customised)")
    policy = httpx.get(f"{gateway.url}/v1/admin/tools/multiply", headers=auth_for("carol"), timeout=10).json()["policy"]
    assert policy["approval_mode"] == "always" and policy["enabled"] is True
