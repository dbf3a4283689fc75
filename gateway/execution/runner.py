"""Running one admitted call: under its timeout, with real cancellation, its result capped,
and every failure turned into an outcome the model can act on.

- ``ToolError`` (business rules: ``NOT_FOUND``, ``CONFLICT``, ``BUSINESS_RULE_VIOLATION``,
  ``PERMISSION_DENIED``, ...) keeps its code and its safe message.
- A timeout cancels the handler and answers ``TOOL_TIMEOUT`` (retryable).
- Anything else is ``TOOL_EXECUTION_FAILED`` with a fresh ``error_id``; the exception and its
  stack are logged under that id and nothing of it reaches the model.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from gateway.errors import ErrorCode, ToolError, new_error_id
from gateway.observability.timing import elapsed_ms
from gateway.execution.results import encode_result, error_content
from gateway.tools.base import DecodedArguments, Tool, ToolContext

log = structlog.get_logger("gateway.execution")

OK = "OK"


@dataclass(frozen=True, slots=True)
class CallOutcome:
    outcome: str
    content: str
    duration_ms: float
    error_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == OK


async def run_tool(
    tool: Tool,
    arguments: DecodedArguments,
    ctx: ToolContext,
    *,
    default_timeout_s: float,
    default_max_result_bytes: int,
) -> CallOutcome:
    timeout_s = ctx.timeout_s = tool.timeout_s or default_timeout_s
    max_result_bytes = ctx.max_result_bytes = tool.max_result_bytes or default_max_result_bytes
    started = time.perf_counter()
    try:
        if tool.local:
            result = await tool.handler(ctx, arguments.value)
        else:
            async with asyncio.timeout(timeout_s):
                result = await tool.handler(ctx, arguments.value)
        content = encode_result(result, max_bytes=max_result_bytes)
    except ToolError as exc:
        return CallOutcome(
            outcome=exc.code.value,
            content=error_content(exc.code, exc.message, retryable=exc.retryable, error_id=exc.error_id),
            duration_ms=elapsed_ms(started),
            error_id=exc.error_id,
        )
    except TimeoutError:
        return CallOutcome(
            outcome=ErrorCode.TOOL_TIMEOUT.value,
            content=error_content(ErrorCode.TOOL_TIMEOUT, f"The tool did not answer within {timeout_s:g} s."),
            duration_ms=elapsed_ms(started),
        )
    except Exception:
        error_id = new_error_id()
        log.exception(
            "tool_execution_failed",
            tool=tool.name,
            tool_call_id=ctx.tool_call_id,
            run=ctx.run_id,
            error_id=error_id,
        )
        return CallOutcome(
            outcome=ErrorCode.TOOL_EXECUTION_FAILED.value,
            content=error_content(ErrorCode.TOOL_EXECUTION_FAILED, error_id=error_id),
            duration_ms=elapsed_ms(started),
            error_id=error_id,
        )
    return CallOutcome(outcome=OK, content=content, duration_ms=elapsed_ms(started))

