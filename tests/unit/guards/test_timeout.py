"""The ``timeout`` guard: a call past its timeout is cancelled and answers TOOL_TIMEOUT."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import ERRORS, ErrorCode, ToolError
from gateway.execution.guards import timeout
from gateway.tools.base import ToolContext
from tests.unit.guards.support import MEMBER_PRINCIPAL, REGISTRY


def ctx(timeout_s: float) -> ToolContext:
    return ToolContext(principal=MEMBER_PRINCIPAL, run_id="run_1", tool_call_id="call_1", request_id=None,
                       db=None, timeout_s=timeout_s)  # type: ignore[arg-type]


async def test_a_call_past_its_timeout_is_cancelled_and_refused_with_tool_timeout():
    cancelled = []

    async def never_answers(tool, arguments, context):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(context.tool_call_id)
            raise

    with pytest.raises(ToolError) as raised:
        await timeout.around(never_answers)(REGISTRY.get("get_article"), None, ctx(0.01))
    assert raised.value.code is ErrorCode.TOOL_TIMEOUT and raised.value.retryable is ERRORS[ErrorCode.TOOL_TIMEOUT].retryable
    assert raised.value.message == "The tool did not answer within 0.01 s."
    assert cancelled == ["call_1"]


async def test_a_call_within_its_timeout_returns_its_result():
    async def answers(tool, arguments, context):
        return {"fine": True}

    assert await timeout.around(answers)(REGISTRY.get("get_article"), None, ctx(5)) == {"fine": True}


async def test_a_local_tool_runs_inline_without_a_timeout_task():
    tasks = []

    async def local(tool, arguments, context):
        tasks.append(asyncio.current_task())
        return 3

    add = REGISTRY.get("add")
    assert add.local
    outer = asyncio.current_task()
    assert await timeout.around(local)(add, None, ctx(5)) == 3 and tasks == [outer]
