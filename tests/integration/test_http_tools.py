"""HTTP tools end to end: the gateway and a business service, both real servers on loopback
ports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote

import httpx
import jwt
import msgspec
import pytest
import structlog

from gateway.auth.principal import Principal
from gateway.auth.service_tokens import load_service_signer
from gateway.errors import ToolError
from gateway.execution.approvals import idempotency_key_for
from gateway.tools.base import ToolContext
from gateway.tools.config import load_http_tools
from gateway.tools.http import ServiceCalls
from gateway.tools.http_transport import service_transport
from tests.integration.http_env import Caller, HttpEnv, http_env
from tests.support.calls import set_policy
from tests.support.logs import CapturedLogs
from tests.support.tokens import auth_for

LEAKS = ("hunter2", "10.0.0.7", "Traceback", "internal")


@pytest.fixture(scope="module")
def env(request: pytest.FixtureRequest) -> Iterator[HttpEnv]:
    yield from http_env(request)


@pytest.fixture
async def gw(env: HttpEnv) -> AsyncIterator[Caller]:
    async with httpx.AsyncClient(base_url=env.gateway_url, timeout=30) as client:
        yield Caller(client)


def seen_by(state, call_id: str) -> list[dict]:
    """The verified claims of the requests the service received for one tool call."""
    return [claims for claims in state.claims if claims["tool_call_id"] == call_id]


async def test_http_tools_are_offered_with_strict_schemas_to_those_granted(env: HttpEnv, gw: Caller):
    response = await gw.client.get("/v1/tools", headers=auth_for("alice"))
    tools = {t["function"]["name"]: t["function"] for t in response.json()["tools"]}
    assert "get_order" in tools and "add" in tools  # file tools beside the built-ins
    assert "create_order" not in tools  # alice (member) lacks orders:write
    response = await gw.client.get("/v1/tools", headers=auth_for("bob"))
    create = {t["function"]["name"]: t["function"] for t in response.json()["tools"]}["create_order"]
    assert create["parameters"]["additionalProperties"] is False


async def test_service_sees_the_caller_from_the_token_not_the_arguments(env: HttpEnv, gw: Caller):
    result = await gw.call("whoami", {}, user="alice", headers={"X-Request-ID": "req-from-client-1"})
    assert result["ok"] is True, result
    seen = result["result"]
    assert seen["sub"] == "alice"
    assert seen["tenant_id"] == "acme"
    assert seen["roles"] == ["member"]
    assert seen["aud"] == "orders"
    assert seen["run_id"] == result["_run"]
    assert seen["tool_call_id"] == result["_call_id"]
    assert seen["request_id"] == "req-from-client-1"


async def test_cookies_a_service_sets_never_reach_another_call(env: HttpEnv, gw: Caller):
    first = await gw.call("whoami", {}, user="bob")
    second = await gw.call("whoami", {}, user="alice")
    assert first["ok"] and second["ok"]
    calls = {first["_call_id"], second["_call_id"]}
    arrived = [r for r in env.service.seen if r.raw_path == "/api/whoami"]
    assert len(arrived) >= 2
    assert all("cookie" not in r.headers for r in arrived)
    assert {c["tool_call_id"] for c in env.service.claims} >= calls


async def test_identity_in_arguments_is_refused_before_the_service_is_called(env: HttpEnv, gw: Caller):
    result = await gw.call("get_order", {"order_id": "ord_1", "user_id": "carol"}, user="alice")
    assert result["error"]["code"] == "INVALID_ARGUMENTS"
    assert "user_id" in result["error"]["message"]
    assert seen_by(env.service, result["_call_id"]) == []


async def test_service_rules_apply_to_the_caller(env: HttpEnv, gw: Caller):
    env.service.orders[("acme", "ord_rules")] = {
        "id": "ord_rules", "tenant_id": "acme", "owner": "bob", "item": "desk", "quantity": 1, "status": "open"
    }
    as_owner = await gw.call("get_order", {"order_id": "ord_rules"}, user="bob")
    assert as_owner["ok"] is True and as_owner["result"]["owner"] == "bob"

    other_user = await gw.call("get_order", {"order_id": "ord_rules"}, user="alice")
    assert other_user["error"]["code"] == "PERMISSION_DENIED"
    assert other_user["error"]["message"] == "Only the owner or an editor may see this order."

    other_tenant = await gw.call("get_order", {"order_id": "ord_rules"}, user="bob", tenant="globex")
    assert other_tenant["error"]["code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (400, "INVALID_ARGUMENTS", False),
        (422, "INVALID_ARGUMENTS", False),
        (401, "PERMISSION_DENIED", False),
        (403, "PERMISSION_DENIED", False),
        (404, "NOT_FOUND", False),
        (409, "CONFLICT", False),
        (429, "RATE_LIMITED", True),
    ],
)
async def test_refusals_map_to_stable_codes_with_only_the_safe_field(
    env: HttpEnv, gw: Caller, status: int, code: str, retryable: bool
):
    result = await gw.call("service_status", {"code": status})
    assert result["ok"] is False
    assert result["error"]["code"] == code
    assert result["error"]["retryable"] is retryable
    assert result["error"]["message"].startswith(f"The service answered {status}.")
    for leak in LEAKS:
        assert leak not in result["_raw"]


async def test_rate_limited_passes_on_retry_after(env: HttpEnv, gw: Caller):
    result = await gw.call("service_status", {"code": 429})
    assert result["error"]["message"] == "The service answered 429. Retry after 7 s."


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retryable_failures_whose_details_stay_in_the_logs(
    env: HttpEnv, gw: Caller, status: int
):
    result = await gw.call("service_status", {"code": status})
    assert result["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert result["error"]["retryable"] is True
    assert result["error"]["error_id"].startswith("err_")
    assert f"answered {status}" not in result["_raw"]
    for leak in LEAKS:
        assert leak not in result["_raw"]


async def test_unexpected_status_is_a_failure_that_retrying_will_not_fix(env: HttpEnv, gw: Caller):
    result = await gw.call("service_status", {"code": 418})
    assert result["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert result["error"]["retryable"] is False
    assert "answered 418" not in result["_raw"]


async def test_safe_field_is_cut_to_its_declared_length(env: HttpEnv, gw: Caller):
    result = await gw.call("get_order", {"order_id": "x" * 70})
    message = result["error"]["message"]
    assert result["error"]["code"] == "NOT_FOUND"
    assert len(message) <= 60
    assert message.startswith("No order xxx") and message.endswith("…")


async def test_service_that_is_down_is_a_retryable_failure(env: HttpEnv, gw: Caller):
    result = await gw.call("unreachable", {})
    assert result["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert result["error"]["retryable"] is True
    assert "127.0.0.1" not in result["_raw"]


async def test_slow_service_times_out(env: HttpEnv, gw: Caller):
    result = await gw.call("slow", {"ms": 3000})
    assert result["error"]["code"] == "TOOL_TIMEOUT"
    assert result["error"]["retryable"] is True


async def test_answer_within_the_limit_is_passed_on_as_json(env: HttpEnv, gw: Caller):
    result = await gw.call("big", {"size": 500})
    assert result["ok"] is True
    assert result["result"] == "x" * 498


async def test_oversized_answer_is_truncated_with_its_original_size(env: HttpEnv, gw: Caller):
    result = await gw.call("big", {"size": 200_000})
    assert result["ok"] is True
    assert result["truncated"] is True
    assert result["original_bytes"] == 200_000
    assert result["result"].endswith("…[truncated]")
    assert len(result["result"].encode()) <= 1024 + len("…[truncated]".encode())


async def test_a_tenant_policy_raising_the_limits_applies_to_the_service_call(env: HttpEnv, gw: Caller):
    # globex only: the declared limits (0.3 s, 1 KiB) stay in force for acme's calls here.
    for tool, policy in (("slow", {"timeout_s": 5}), ("big", {"max_result_bytes": 4096})):
        await set_policy(gw.client, tool, policy, tenant="globex")
    slow = await gw.call("slow", {"ms": 800}, tenant="globex")
    assert slow["ok"] is True and slow["result"] == {"slept_ms": 800}
    big = await gw.call("big", {"size": 3000}, tenant="globex")
    assert big["ok"] is True and big["result"] == "x" * 2998 and "truncated" not in big
    assert (await gw.call("big", {"size": 3000}))["truncated"] is True


async def test_endless_answer_is_read_only_up_to_the_limit(env: HttpEnv, gw: Caller):
    before = env.service.endless_bytes_sent
    result = await gw.call("endless", {})
    # Reading it all would never finish: the tool would time out instead.
    assert result["ok"] is True and result["truncated"] is True
    assert "original_bytes" not in result  # unknown: the body was not read to its end
    assert result["result"].startswith("yyyy")
    # What the service managed to write is bounded by the socket buffers, not by the body.
    assert env.service.endless_bytes_sent - before < 32 * 1024 * 1024


@pytest.mark.parametrize(
    "value",
    [
        "a/b",
        "../admin",
        "..%2F..%2Fadmin",
        "%2e%2e",
        "...",
        "x?admin=1#frag",
        "@evil.example",
        "user:pass@evil.example",
        "http://127.0.0.1:{trap}/api/whoami",
        "//127.0.0.1:{trap}/api/whoami",
        "x\r\nX-Injected: 1",
        "\\..\\..\\",
        "naïve café",
    ],
)
async def test_path_values_are_encoded_and_stay_on_the_service(env: HttpEnv, gw: Caller, value: str):
    value = value.replace("{trap}", str(env.trap_port))
    before = len(env.service.seen)
    result = await gw.call("echo", {"value": value, "q": "&admin=true\r\nX-Injected: 1"})
    arrived = [r for r in env.service.seen[before:] if r.raw_path.startswith("/api/echo/")]
    assert len(arrived) == 1, result
    request = arrived[0]
    assert request.raw_path == "/api/echo/" + quote(value, safe="")
    assert request.query == "q=" + quote("&admin=true\r\nX-Injected: 1", safe="")
    assert request.headers["host"] == env.service_url.removeprefix("http://")
    assert "x-injected" not in request.headers
    assert env.trap.seen == []


@pytest.mark.parametrize("value", [".", "..", ""])
async def test_dot_segments_and_empty_segments_are_refused(env: HttpEnv, gw: Caller, value: str):
    before = len(env.service.seen)
    result = await gw.call("echo", {"value": value})
    assert result["error"]["code"] == "INVALID_ARGUMENTS"
    assert "`value`" in result["error"]["message"]
    assert env.service.seen[before:] == []


async def test_redirects_are_not_followed(env: HttpEnv, gw: Caller):
    result = await gw.call("redirect", {"to": f"{env.trap_url}/api/whoami"})
    assert result["error"]["code"] == "TOOL_EXECUTION_FAILED"
    assert result["error"]["retryable"] is False
    assert env.trap.seen == []


async def test_token_is_only_good_for_the_service_it_was_signed_for(env: HttpEnv, gw: Caller):
    # The billing service's token reaches the orders server, which refuses its audience.
    result = await gw.call("billing_whoami", {})
    assert result["error"]["code"] == "PERMISSION_DENIED"


async def test_service_token_is_short_lived_and_verifiable_with_the_public_jwks(env: HttpEnv, gw: Caller):
    result = await gw.call("whoami", {})
    assert result["ok"] is True
    arrived = next(
        r for r in reversed(env.service.seen) if r.raw_path == "/api/whoami" and "authorization" in r.headers
    )
    token = arrived.headers["authorization"].removeprefix("Bearer ")
    jwks = (await gw.client.get("/.well-known/jwks.json")).json()
    key = jwt.PyJWKSet.from_dict(jwks)[jwt.get_unverified_header(token)["kid"]]
    claims = jwt.decode(token, key.key, algorithms=["ES256"], audience="orders", issuer="gateway")
    assert claims["exp"] - claims["iat"] == env.settings.services.token_ttl_s
    assert claims["tool_call_id"] == result["_call_id"]


async def test_jwks_route_is_public_and_holds_only_the_public_key(env: HttpEnv, gw: Caller):
    response = await gw.client.get("/.well-known/jwks.json")
    assert response.status_code == 200
    assert "max-age" in response.headers["cache-control"]
    (key,) = response.json()["keys"]
    assert key["alg"] == "ES256" and key["use"] == "sig" and key["kty"] == "EC"
    assert "d" not in key  # the private part


async def test_sensitive_argument_is_never_echoed(env: HttpEnv, gw: Caller):
    result = await gw.call("create_order", {"item": "desk", "quantity": 1, "payment_token": "4111111111111111"},
                           user="bob")
    assert result["error"]["code"] == "INVALID_ARGUMENTS"
    assert "payment_token" in result["error"]["message"]
    assert "4111111111111111" not in result["_raw"]


async def approve(gw: Caller, approval_id: str, approver: str = "carol") -> dict:
    response = await gw.client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for(approver))
    assert response.status_code == 200, response.text
    return response.json()


async def test_mutating_tool_runs_once_approved_as_the_requester_with_an_idempotency_key(env: HttpEnv, gw: Caller):
    changes = env.service.applied_changes
    asked = await gw.call("create_order", {"item": "lamp", "quantity": 2, "payment_token": "tok_abcdefgh"},
                          user="bob")
    assert asked["error"]["code"] == "APPROVAL_REQUIRED"
    approval_id = asked["error"]["approval_id"]
    assert seen_by(env.service, asked["_call_id"]) == []
    assert env.service.applied_changes == changes

    listed = await gw.client.get("/v1/admin/approvals?status=pending", headers=auth_for("carol"))
    pending = next(item for item in listed.json()["items"] if item["id"] == approval_id)
    assert pending["arguments"]["payment_token"] == "[REDACTED]"

    decided = await approve(gw, approval_id)
    assert decided["status"] == "succeeded"
    order = decided["outcome"]["result"]
    assert order["owner"] == "bob" and order["item"] == "lamp"
    (claims,) = seen_by(env.service, asked["_call_id"])
    assert claims["sub"] == "bob"  # the requester, not carol who approved
    arrived = next(r for r in reversed(env.service.seen) if r.raw_path == "/api/orders")
    assert arrived.headers["idempotency-key"] == idempotency_key_for("acme", approval_id)
    assert env.service.applied_changes == changes + 1

    # The model asking again for the same call gets the stored outcome.
    replay = await gw.client.post(
        f"/v1/runs/{asked['_run']}/tool-calls",
        headers=auth_for("bob"),
        json={"tool_calls": [{"id": asked["_call_id"], "type": "function", "function": {
            "name": "create_order", "arguments": '{"item": "lamp", "quantity": 2, "payment_token": "tok_abcdefgh"}'}}]},
    )
    assert '"owner":"bob"' in replay.json()["messages"][0]["content"].replace(" ", "")
    assert env.service.applied_changes == changes + 1


async def test_service_business_refusal_after_approval_is_the_outcome(env: HttpEnv, gw: Caller):
    asked = await gw.call("create_order", {"item": "chairs", "quantity": 500}, user="bob")
    decided = await approve(gw, asked["error"]["approval_id"])
    assert decided["status"] == "failed"
    assert decided["outcome"]["error"]["code"] == "INVALID_ARGUMENTS"
    assert decided["outcome"]["error"]["message"] == "A single order may hold at most 100 items."


async def test_state_conflict_at_the_service_is_conflict(env: HttpEnv, gw: Caller):
    env.service.orders[("acme", "ord_done")] = {
        "id": "ord_done", "tenant_id": "acme", "owner": "bob", "item": "desk", "quantity": 1, "status": "cancelled"
    }
    asked = await gw.call("cancel_order", {"order_id": "ord_done"}, user="bob")
    decided = await approve(gw, asked["error"]["approval_id"])
    assert decided["outcome"]["error"]["code"] == "CONFLICT"
    assert decided["outcome"]["error"]["message"] == "This order is already cancelled."


async def test_retried_execution_of_an_approved_call_applies_once(env: HttpEnv, gw: Caller):
    """Were the approved call executed again (a retry after a lost answer), it would carry
    the same Idempotency-Key, and a service that honours it applies nothing twice."""
    arguments = b'{"item": "stapler", "quantity": 3}'
    asked = await gw.call("create_order", arguments.decode(), user="bob")
    approval_id = asked["error"]["approval_id"]
    decided = await approve(gw, approval_id)
    assert decided["status"] == "succeeded"
    changes = env.service.applied_changes

    calls = ServiceCalls(load_service_signer(env.settings), max_calls_per_tenant=25)
    tool = {t.name: t for t in load_http_tools(env.settings, calls)}["create_order"]
    bob = Principal(tenant_id="acme", user_id="bob", roles=frozenset({"editor"}), permissions=frozenset())
    ctx = ToolContext(
        principal=bob, run_id=asked["_run"], tool_call_id=asked["_call_id"], request_id="req-retry",
        db=None,  # type: ignore[arg-type]  # an HTTP tool never touches the gateway's database
        idempotency_key=idempotency_key_for("acme", approval_id),
    )
    transport = service_transport(limits=httpx.Limits(max_connections=10, max_keepalive_connections=10))
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        calls.attach(client, transport)
        again = await tool.handler(ctx, tool.arguments.decode(arguments).value)
    assert env.service.applied_changes == changes
    assert msgspec.json.decode(again) == decided["outcome"]["result"]


CARD = "4111111111111111"


async def test_a_sensitive_value_the_service_quotes_back_reaches_neither_the_model_nor_the_audit(
    env: HttpEnv, gw: Caller
):
    """Services quote the input they refuse (a 422 naming the bad value): the declared error
    field carried a sensitive argument to the model, and the audit, as it was sent."""
    result = await gw.call("check_card", {"card_number": CARD})
    assert result["error"]["code"] == "INVALID_ARGUMENTS"
    assert result["error"]["message"] == "Card [REDACTED] was refused."
    assert CARD not in result["_raw"]
    audit = await gw.client.get("/v1/admin/audit", params={"run": result["_run"]}, headers=auth_for("carol"))
    assert audit.status_code == 200 and audit.json()["items"]
    assert CARD not in audit.text


@pytest.mark.parametrize(("status", "event"), [(422, "service_call_refused"), (500, "service_call_failed")])
async def test_a_sensitive_value_the_service_quotes_back_is_not_in_the_logged_excerpt(
    env: HttpEnv, status: int, event: str
):
    calls = ServiceCalls(load_service_signer(env.settings), max_calls_per_tenant=25)
    tool = {t.name: t for t in load_http_tools(env.settings, calls)}["check_card"]
    alice = Principal(tenant_id="acme", user_id="alice", roles=frozenset({"member"}), permissions=frozenset())
    ctx = ToolContext(principal=alice, run_id="run_x", tool_call_id="call_x", request_id=None,
                      db=None)  # type: ignore[arg-type]  # an HTTP tool never touches the gateway's database
    saved = structlog.get_config()
    logs = CapturedLogs()
    logs.install()
    try:
        transport = service_transport(limits=httpx.Limits(max_connections=2, max_keepalive_connections=2))
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            calls.attach(client, transport)
            with pytest.raises(ToolError):
                await tool.handler(ctx, tool.arguments.decode(
                    msgspec.json.encode({"card_number": CARD, "code": status})).value)
    finally:
        structlog.configure(**saved)
    (logged,) = logs.named(event)
    assert "[REDACTED]" in logged["response_excerpt"] and CARD not in logs.text
