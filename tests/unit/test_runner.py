"""Running one admitted call: timeout with real cancellation, error mapping, result cap."""

from __future__ import annotations

import json

from gateway.auth.principal import Principal
from gateway.demo import MEMBER
from gateway.db.policies import DEFAULT_POLICY
from gateway.errors import ConflictError, ErrorCode
from gateway.execution.policy import tool_limits
from gateway.execution.runner import run_tool
from gateway.tools.base import ToolContext, struct_tool
from gateway.tools.builtin import NoArguments, TwoIntegers, divide
from tests.support.tools import LEAKY_DETAILS, Probe, SleepArgs, probe_tools

PRINCIPAL = Principal(tenant_id="acme", user_id="alice", roles=frozenset({"member"}), permissions=MEMBER)


def context(call_id: str = "call_1") -> ToolContext:
    # The tools here touch no database.
    return ToolContext(principal=PRINCIPAL, run_id="run_1", tool_call_id=call_id, request_id="req_1", db=None)  # type: ignore[arg-type]


def tool_named(probe: Probe, name: str):
    return next(tool for tool in probe_tools(probe) if tool.name == name)


async def run(tool, raw: bytes, *, call_id: str = "call_1", timeout_s: float = 5.0, max_bytes: int = 16_384):
    return await run_tool(
        tool, tool.arguments.decode(raw), context(call_id), limits=tool_limits(tool, DEFAULT_POLICY),
        default_timeout_s=timeout_s, default_max_result_bytes=max_bytes,
    )


async def test_a_tool_over_its_timeout_is_cancelled_and_answers_retryable_tool_timeout():
    probe = Probe()
    outcome = await run(tool_named(probe, "sleep"), b'{"seconds": 30}')
    assert outcome.outcome == "TOOL_TIMEOUT"
    error = json.loads(outcome.content)["error"]
    assert error["code"] == "TOOL_TIMEOUT" and error["retryable"] is True
    assert probe.cancelled == ["call_1"] and probe.finished == []


async def test_a_tool_without_its_own_timeout_gets_the_default():
    probe = Probe()
    cancelled: list[str] = []

    @struct_tool(name="slow", description="d", arguments=SleepArgs, permission="p")
    async def slow(ctx, args):
        try:
            await probe.everyone_here().wait()  # never set
        except BaseException:
            cancelled.append(ctx.tool_call_id)
            raise

    outcome = await run(slow, b'{"seconds": 1}', timeout_s=0.05)
    assert outcome.outcome == "TOOL_TIMEOUT" and cancelled == ["call_1"]


async def test_a_tool_within_its_timeout_answers_ok():
    probe = Probe()
    outcome = await run(tool_named(probe, "sleep"), b'{"seconds": 0}')
    assert outcome.ok and json.loads(outcome.content) == {"ok": True, "result": {"slept": 0}}


async def test_divide_by_zero_is_a_business_rule_violation_that_is_not_retryable():
    outcome = await run(divide, b'{"a": 1, "b": 0}')
    error = json.loads(outcome.content)["error"]
    assert outcome.outcome == "BUSINESS_RULE_VIOLATION"
    assert error == {"code": "BUSINESS_RULE_VIOLATION", "message": "Division by zero is not defined.", "retryable": False}


async def test_a_business_error_keeps_its_code_and_safe_message():
    @struct_tool(name="conflicted", description="d", arguments=NoArguments, permission="p")
    async def conflicted(ctx, args):
        raise ConflictError("The article changed meanwhile.")

    outcome = await run(conflicted, b"{}")
    assert outcome.outcome == "CONFLICT"
    assert json.loads(outcome.content)["error"]["message"] == "The article changed meanwhile."


async def test_an_unexpected_exception_is_tool_execution_failed_with_an_error_id_and_leaks_nothing(logs):
    probe = Probe()
    outcome = await run(tool_named(probe, "explode"), b"{}")
    assert outcome.outcome == ErrorCode.TOOL_EXECUTION_FAILED.value
    error = json.loads(outcome.content)["error"]
    assert error["error_id"] == outcome.error_id and outcome.error_id.startswith("err_")
    assert error["retryable"] is True
    for detail in (*LEAKY_DETAILS, "RuntimeError", "Traceback"):
        assert detail not in outcome.content
    (event,) = logs.named("tool_execution_failed")
    assert event["error_id"] == outcome.error_id
    assert "Traceback" in event["exception"] and LEAKY_DETAILS[0] in event["exception"]


async def test_a_result_over_the_tools_limit_is_truncated():
    probe = Probe()
    outcome = await run(tool_named(probe, "big"), b'{"size": 1000}')
    content = json.loads(outcome.content)
    assert outcome.ok and content["truncated"] is True and content["original_bytes"] == 2002


async def test_a_tool_without_its_own_limit_gets_the_default_limit():
    @struct_tool(name="wide", description="d", arguments=TwoIntegers, permission="p")
    async def wide(ctx, args):
        return "z" * args.a

    assert json.loads((await run(wide, b'{"a": 100, "b": 0}', max_bytes=20)).content)["truncated"] is True
    assert "truncated" not in json.loads((await run(wide, b'{"a": 10, "b": 0}', max_bytes=20)).content)
