"""``INVALID_ARGUMENTS``: the arguments are a JSON document that nests no deeper than
``GATEWAY_MAX_JSON_DEPTH``, holds only storable text, gives each key once (which of two
values was meant is unknowable), and decodes strictly against the tool's schema (an
identity field the schema does not define is refused like any other unknown field)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.errors import ErrorCode
from gateway.execution.guards.base import CheckContext, Guard, Stage
from gateway.execution.protocol import ToolCallRequest
from gateway.observability.timing import VALIDATION
from gateway.text import json_document_problem
from gateway.tools.base import ArgumentsInvalid, DecodedArguments, Tool

if TYPE_CHECKING:
    from gateway.execution.checks import CallPlan


def decode_arguments(tool: Tool, request: ToolCallRequest, *, max_json_depth: int) -> DecodedArguments:
    problem = json_document_problem(request.arguments, max_depth=max_json_depth)
    if problem is not None:
        raise ArgumentsInvalid(f"{problem}.")
    return tool.arguments.decode(request.arguments)


def check(plan: CallPlan, context: CheckContext) -> str | None:
    tool = plan.tool
    assert tool is not None
    try:
        plan.arguments = decode_arguments(tool, plan.request, max_json_depth=context.max_json_depth)
    except ArgumentsInvalid as exc:
        return f"Invalid arguments for {tool.name!r}: {exc.message}"
    return None


GUARD = Guard(name="arguments", stage=Stage.CHECK, code=ErrorCode.INVALID_ARGUMENTS, check=check, timed_as=VALIDATION)
