"""Hostile requests against a real `gateway serve` process: every one is answered a 4xx in the
error envelope, none a 5xx, and the gateway's log holds no traceback without an error id."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

from tests.support.app import seeded
from tests.support.processes import gateways
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres

BOB = auth_for("bob")
CAROL = auth_for("carol")
DEEP = "[" * 1000 + "]" * 1000


def cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def hostile_requests(run_id: str) -> list[tuple[str, str, dict[str, str], str | None]]:
    """(method, path with query, headers, raw JSON body)."""
    calls = f"/v1/runs/{run_id}/tool-calls"
    surrogate_twice = json.dumps({"tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "add", "arguments": '{"\\ud800": 1, "\\ud800": 2}'}}]})
    return [
        ("POST", calls, BOB, '{"tool_calls": [], "extra": %s}' % DEEP),
        ("POST", calls, BOB, '{"tool_calls": [{"id": "c", "type": "function", "function": '
                             '{"name": "add", "arguments": {"a": %s}}}]}' % DEEP),
        ("POST", calls, BOB, '{"tool_calls": [{"id": "c", "type": "function", "k\\u0000": 1, '
                             '"function": {"name": "add", "arguments": "{}"}}]}'),
        ("POST", calls, BOB, surrogate_twice),
        ("POST", "/v1/runs", BOB, '{"limits": %s}' % DEEP),
        ("POST", "/v1/runs", BOB, '{"expires_at": "9999-12-31T23:59:59-05:00"}'),
        ("POST", "/v1/chat/completions", BOB, '{"messages": %s}' % DEEP),
        ("POST", f"/v1/runs/{run_id}/resume", BOB, '{"x": %s}' % DEEP),
        ("POST", "/v1/admin/roles", CAROL, '{"name": "r", "description": "a\\u0000", "permissions": []}'),
        ("PUT", "/v1/admin/roles/member", CAROL, '{"description": "a\\u0000", "permissions": []}'),
        ("PUT", "/v1/admin/tools/add", CAROL, '{"allowed_roles": %s}' % DEEP),
        ("PATCH", "/v1/admin/tenant", CAROL, '{"max_run_ttl_s": 100, "max_run_ttl_s": 200}'),
        ("POST", "/v1/admin/approvals/apr_x/reject", CAROL, None),
        ("GET", "/v1/admin/audit?user=%00", CAROL, None),
        ("GET", "/v1/admin/audit/export?user=%00", CAROL, None),
        ("GET", "/v1/admin/audit?cursor=" + cursor({"before": 2**63}), CAROL, None),
        ("GET", "/v1/admin/audit?since=0001-01-01T00:00:00%2B05:00", CAROL, None),
        ("GET", "/v1/admin/audit/export?until=9999-12-31T23:59:59-05:00", CAROL, None),
        ("GET", "/v1/admin/audit?until=0.5", CAROL, None),
        ("GET", "/v1/admin/approvals?cursor=" + cursor(["0001-01-01T00:00:00+05:00", "a"]), CAROL, None),
        ("OPTIONS", "/v1/admin/roles", {}, None),
        ("OPTIONS", "/v1/admin/audit", {}, None),
    ]


async def test_hostile_requests_get_4xx_envelopes_and_leave_no_traceback_without_an_error_id(pg_url):
    await seeded(pg_url)
    with gateways(pg_url, 1, log_level="INFO", audit_seal_interval_s=0) as (gateway,):
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            run = await http.post("/v1/runs", json={}, headers=BOB)
            assert run.status_code == 201, run.text
            answered = []
            for method, path, headers, body in hostile_requests(run.json()["id"]):
                content = body.encode() if body is not None else None
                response = await http.request(
                    method, path, content=content, headers={**headers, "Content-Type": "application/json"}
                )
                answered.append((method, path[:60], response.status_code))
                assert response.status_code < 500, (method, path[:80], response.text)
                if response.status_code >= 400:
                    error = response.json()["error"]
                    assert error["request_id"] == response.headers["x-request-id"]
        log = gateway.log_path.read_text(errors="replace")
        events = gateway.log_events()
    assert all(status < 500 for _, _, status in answered), answered
    for line in log.splitlines():
        if "Traceback" in line:
            event = json.loads(line)
            assert event.get("error_id") and event.get("request_id"), line
    assert not [event for event in events if "exc_info" in event]


async def test_a_body_of_unterminated_escaped_quotes_is_answered_at_once_and_the_gateway_stays_responsive(pg_url):
    """The nesting check scans strings first; each quote of a string that never closes used to
    start a scan to the end of the body: ~900 KB of `\\"` held the event loop for hours."""
    await seeded(pg_url)
    body = "[" * 100 + '"' + '\\"' * 450_000
    with gateways(pg_url, 1) as (gateway,):
        # The client's timeout only guards against a hang: answered, this takes milliseconds.
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            run = await http.post("/v1/runs", json={}, headers=BOB)
            assert run.status_code == 201, run.text
            for path in (f"/v1/runs/{run.json()['id']}/tool-calls", "/v1/runs", "/v1/chat/completions"):
                response = await http.post(path, content=body.encode(),
                                           headers={**BOB, "Content-Type": "application/json"})
                assert 400 <= response.status_code < 500, (path, response.text)
                assert response.json()["error"]["request_id"] == response.headers["x-request-id"]
            assert (await http.get("/healthz")).status_code == 200


async def test_gateway_serve_bounds_request_heads_by_its_settings(pg_url):
    await seeded(pg_url)
    with gateways(pg_url, 1, log_level="INFO", audit_seal_interval_s=0, max_head_bytes=2048,
                  head_timeout_s=1) as (gateway,):
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            fits = await http.get("/v1/tools", headers={"x-padding": "a" * 1500, **auth_for("alice")})
            assert fits.status_code == 200
            refused = await http.get("/v1/tools", headers={"x-padding": "a" * 3000, **auth_for("alice")})
            assert refused.status_code == 431
            assert refused.json()["error"]["code"] == "HEADERS_TOO_LARGE"
        host, port = gateway.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # and nothing more
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 20)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ")
        refusals = [e for e in gateway.log_events() if e.get("event") == "request_head_refused"]
    assert [e["status"] for e in refusals] == [431, 408]
