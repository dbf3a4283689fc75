"""The per-call checks that need no database, in the order the model sees their codes:
the tool exists (``TOOL_NOT_FOUND``), the caller's roles grant it and the tenant's policy
lets them use it (``PERMISSION_DENIED``), the arguments decode strictly against its schema
(``INVALID_ARGUMENTS``). The tenant's policy also decides whether the call needs approval,
its timeout and result size, and its per-run cap (see ``gateway.execution.policy``).

A call that fails one gets its outcome here; a call that passes becomes a ``CallPlan``
that the ledger then counts against the run's budget and repeat limit. A model's call that
already broke the protocol (``ToolCallRequest.rejected``, the agent loop) gets that code
here, so the ledger stores and audits it like any other refused call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode
from gateway.execution.policy import is_visible, needs_approval, runs_in_transaction
from gateway.execution.protocol import ToolCallRequest
from gateway.execution.results import error_content
from gateway.observability.timing import POLICY, UNTIMED, VALIDATION, StageTimer
from gateway.text import DEFAULT_MAX_JSON_DEPTH, json_document_problem
from gateway.tools.base import ArgumentsInvalid, DecodedArguments, Tool, call_hash, sha256_hex
from gateway.tools.registry import ToolRegistry


@dataclass(slots=True)
class CallPlan:
    request: ToolCallRequest
    tool: Tool | None
    arguments: DecodedArguments | None
    arguments_sha256: str
    audit_arguments: Any
    """JSON-ready: a dict, or the canonical arguments as ``msgspec.Raw`` when nothing needs redacting."""
    call_hash: str | None = None
    rejected: ErrorCode | None = None
    rejection_content: str | None = None
    needs_approval: bool = False
    approval_id: str | None = None
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


def _reject(request: ToolCallRequest, tool: Tool | None, code: ErrorCode, message: str | None = None) -> CallPlan:
    return CallPlan(
        request=request,
        tool=tool,
        arguments=None,
        # Arguments that did not decode are never stored, only their hash: they may hold anything.
        arguments_sha256=sha256_hex(request.arguments),
        audit_arguments=None,
        rejected=code,
        rejection_content=error_content(code, message),
    )


def check_tool_exists(registry: ToolRegistry, request: ToolCallRequest) -> Tool | None:
    return registry.get(request.name)


def check_permission(principal: Principal, tool: Tool) -> bool:
    policy = principal.tool_policies.for_tool(tool.name)
    return is_visible(tool, policy, permissions=principal.permissions, roles=principal.roles)


def decode_arguments(tool: Tool, request: ToolCallRequest, *, max_json_depth: int) -> DecodedArguments:
    """The call's arguments as the model sent them: a JSON document that must nest no deeper
    than ``max_json_depth``, hold only storable text and give each key once (which of two
    values was meant is unknowable), then decode strictly against the tool's schema."""
    problem = json_document_problem(request.arguments, max_depth=max_json_depth)
    if problem is not None:
        raise ArgumentsInvalid(f"{problem}.")
    return tool.arguments.decode(request.arguments)


def plan_call(
    registry: ToolRegistry,
    principal: Principal,
    request: ToolCallRequest,
    timer: StageTimer = UNTIMED,
    *,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
) -> CallPlan:
    if request.rejected is not None:  # broke the protocol (a model's call): answered, audited, never run
        return _reject(request, None, *request.rejected)
    tool = check_tool_exists(registry, request)
    allowed = tool is not None and check_permission(principal, tool)
    timer.lap(POLICY)
    if tool is None:
        return _reject(request, None, ErrorCode.TOOL_NOT_FOUND, f"No tool named {request.name!r} exists.")
    if not allowed:
        # The tool exists but is not granted: say so, and reveal nothing of its schema.
        return _reject(request, tool, ErrorCode.PERMISSION_DENIED, f"You are not allowed to use {tool.name!r}.")
    try:
        decoded = decode_arguments(tool, request, max_json_depth=max_json_depth)
    except ArgumentsInvalid as exc:
        return _reject(request, tool, ErrorCode.INVALID_ARGUMENTS, f"Invalid arguments for {tool.name!r}: {exc.message}")
    policies = principal.tool_policies
    policy = policies.for_tool(tool.name)
    plan = CallPlan(
        request=request,
        # The tenant's timeout and maximum result size, when its policy sets them.
        tool=policies.effective_tool(tool),
        arguments=decoded,
        arguments_sha256=sha256_hex(decoded.canonical),
        audit_arguments=tool.audit_arguments(decoded),
        call_hash=call_hash(tool.name, decoded.canonical),
        needs_approval=needs_approval(tool, policy),
        tool_call_cap=policy.max_calls_per_run,
        transactional=runs_in_transaction(tool, policy),
    )
    timer.lap(VALIDATION)
    return plan
