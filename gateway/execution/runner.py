"""Running one admitted call inside the execution guards (``gateway.execution.guards``:
its timeout, then its result cap), every failure turned into an outcome the model can act on.

- ``ToolError`` (business rules: ``NOT_FOUND``, ``CONFLICT``, ``BUSINESS_RULE_VIOLATION``,
  ``PERMISSION_DENIED``, ..., and the timeout guard's ``TOOL_TIMEOUT``) keeps its code and
  its safe message.
- Anything else is ``TOOL_EXECUTION_FAILED`` with a fresh ``error_id``; the exception and its
  stack are logged under that id and nothing of it reaches the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from gateway.errors import ErrorCode, ToolError, new_error_id
from gateway.execution.guards import run_guarded
from gateway.execution.policy import ToolLimits
from gateway.execution.results import ErrorDetail, detail_content, error_detail
from gateway.observability.timing import elapsed_ms
from gateway.tools.base import DecodedArguments, Tool, ToolContext

log = structlog.get_logger("gateway.execution")

OK = "OK"


@dataclass(frozen=True, slots=True)
class CallOutcome:
    outcome: str
    content: str
    duration_ms: float
    error_id: str | None = None
    error: ErrorDetail | None = None
    """What ``content`` says when the call failed, as a value (nobody parses ``content`` back)."""

    @property
    def ok(self) -> bool:
        return self.outcome == OK


def failed(detail: ErrorDetail, duration_ms: float) -> CallOutcome:
    return CallOutcome(
        outcome=detail.code, content=detail_content(detail), duration_ms=duration_ms, error_id=detail.error_id,
        error=detail,
    )


async def run_tool(
    tool: Tool,
    arguments: DecodedArguments,
    ctx: ToolContext,
    *,
    limits: ToolLimits,
    default_timeout_s: float,
    default_max_result_bytes: int,
) -> CallOutcome:
    """``limits``: the call's effective limits; one left ``None`` is the gateway's default."""
    # What the execution guards enforce, and what a handler that enforces its own reads.
    ctx.timeout_s = limits.timeout_s or default_timeout_s
    ctx.max_result_bytes = limits.max_result_bytes or default_max_result_bytes
    started = time.perf_counter()
    try:
        content = await run_guarded(tool, arguments.value, ctx)
    except ToolError as exc:
        detail = error_detail(exc.code, exc.message, retryable=exc.retryable, error_id=exc.error_id)
        return failed(detail, elapsed_ms(started))
    except Exception:
        error_id = new_error_id()
        log.exception(
            "tool_execution_failed",
            tool=tool.name,
            tool_call_id=ctx.tool_call_id,
            run=ctx.run_id,
            error_id=error_id,
        )
        return failed(error_detail(ErrorCode.TOOL_EXECUTION_FAILED, error_id=error_id), elapsed_ms(started))
    return CallOutcome(outcome=OK, content=content, duration_ms=elapsed_ms(started))
