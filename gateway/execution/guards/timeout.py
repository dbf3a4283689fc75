"""``TOOL_TIMEOUT`` (retryable): a call runs under its effective timeout and is cancelled
past it. A ``local`` tool (no I/O) runs inline: a timeout could not interrupt it."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.errors import ErrorCode, ToolError
from gateway.execution.guards.base import Call, Guard, Stage
from gateway.tools.base import Tool, ToolContext


def around(call: Call) -> Call:
    async def timed(tool: Tool, arguments: Any, ctx: ToolContext) -> Any:
        try:
            if tool.local:
                return await call(tool, arguments, ctx)
            async with asyncio.timeout(ctx.timeout_s):
                return await call(tool, arguments, ctx)
        except TimeoutError:
            raise ToolError(ErrorCode.TOOL_TIMEOUT, f"The tool did not answer within {ctx.timeout_s:g} s.") from None

    return timed


GUARD = Guard(name="timeout", stage=Stage.EXECUTION, code=ErrorCode.TOOL_TIMEOUT, around=around)
