"""A call planned for admission: the checks of ``gateway.execution.guards`` run over it in
Python, in the list's order; the first that refuses gives the call its outcome here, and a
call that passes them all gets the inputs of the admission guards (which the ledger's one
statement then decides). A model's call that already broke the protocol
(``ToolCallRequest.rejected``, the agent loop) gets that code here, so the ledger stores
and audits it like any other refused call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode
from gateway.execution.guards import CHECKS, PREPARES, CheckContext
from gateway.execution.policy import ToolLimits, runs_in_transaction, tool_limits
from gateway.execution.protocol import ToolCallRequest
from gateway.execution.results import error_content
from gateway.observability.timing import UNTIMED, StageTimer
from gateway.text import DEFAULT_MAX_JSON_DEPTH
from gateway.tools.base import DecodedArguments, Tool, sha256_hex
from gateway.tools.registry import ToolRegistry

_NO_LIMITS = ToolLimits(timeout_s=None, max_result_bytes=None, max_calls_per_run=None)


@dataclass(slots=True)
class CallPlan:
    request: ToolCallRequest
    tool: Tool | None = None
    arguments: DecodedArguments | None = None
    arguments_sha256: str = ""
    audit_arguments: Any = None
    """JSON-ready: a dict, or the canonical arguments as ``msgspec.Raw`` when nothing needs redacting."""
    call_hash: str | None = None
    rejected: ErrorCode | None = None
    rejection_content: str | None = None
    needs_approval: bool = False
    approval_id: str | None = None
    limits: ToolLimits = _NO_LIMITS
    """The call's effective limits (``gateway.execution.policy.tool_limits``)."""
    tool_call_cap: int | None = None
    """The tenant's per-run cap on calls of this tool: the ledger counts admitted calls per
    (run, tool) and answers ``BUDGET_EXCEEDED`` past it. ``None``: no cap."""
    transactional: bool = False
    """Changes data without approval: must run in one transaction with its outcome and audit row."""

    @property
    def id(self) -> str:
        return self.request.id

    def audit_arguments_value(self) -> Any:
        """The audit arguments as plain Python values (for SQLAlchemy's JSON columns)."""
        value = self.audit_arguments
        return msgspec.json.decode(value) if isinstance(value, msgspec.Raw) else value


def _reject(plan: CallPlan, code: ErrorCode, message: str | None = None) -> CallPlan:
    plan.arguments = None
    # Arguments that did not decode are never stored, only their hash: they may hold anything.
    plan.arguments_sha256 = sha256_hex(plan.request.arguments)
    plan.rejected = code
    plan.rejection_content = error_content(code, message)
    return plan


def plan_calls(
    registry: ToolRegistry,
    principal: Principal,
    requests: list[ToolCallRequest],
    timer: StageTimer = UNTIMED,
    *,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
) -> list[CallPlan]:
    """The plans of a batch's calls, in order."""
    context = CheckContext(registry, principal, max_json_depth)
    return [_plan(context, request, timer) for request in requests]


def plan_call(
    registry: ToolRegistry,
    principal: Principal,
    request: ToolCallRequest,
    timer: StageTimer = UNTIMED,
    *,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
) -> CallPlan:
    return _plan(CheckContext(registry, principal, max_json_depth), request, timer)


def _plan(context: CheckContext, request: ToolCallRequest, timer: StageTimer) -> CallPlan:
    plan = CallPlan(request=request)
    if request.rejected is not None:  # broke the protocol (a model's call): answered, audited, never run
        return _reject(plan, *request.rejected)
    for check, code, timed_as in CHECKS:
        refusal = check(plan, context)
        timer.lap(timed_as)
        if refusal is not None:
            return _reject(plan, code, refusal)
    tool, decoded = plan.tool, plan.arguments
    assert tool is not None and decoded is not None
    policy = context.principal.tool_policies.for_tool(tool.name)
    plan.arguments_sha256 = sha256_hex(decoded.canonical)
    plan.audit_arguments = tool.audit_arguments(decoded)
    plan.limits = tool_limits(tool, policy)
    plan.transactional = runs_in_transaction(tool, policy)
    for prepare in PREPARES:
        prepare(plan, policy)
    return plan
