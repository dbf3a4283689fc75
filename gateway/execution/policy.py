"""How a tenant's tool policy shapes what a caller sees and how a call runs: one rule each.

- visibility (``is_visible``): the caller's roles grant the tool's permission, the tool is
  enabled, and (when the policy names roles) one of the caller's roles is allowed. Listing
  (``GET /v1/tools``, the tools the agent loop offers) and calling (the ``permission``
  guard, approvals) ask this one function: a tool that fails it is neither listed nor
  callable (``PERMISSION_DENIED``, never ``TOOL_NOT_FOUND``).
- approval (``needs_approval``): ``never``, ``mutating`` (tools that change data) or ``always``.
- limits (``tool_limits``): the policy's timeout and maximum result size replace the
  tool's, and its per-run cap applies; execution, approvals and the admin API ask this one
  function. A limit left ``None`` is the gateway's default (``GATEWAY_TOOL_TIMEOUT_S``,
  ``GATEWAY_TOOL_MAX_RESULT_BYTES``), applied where the call runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gateway.db.policies import ApprovalMode, ToolPolicy
from gateway.tools.base import Tool


def is_visible(tool: Tool, policy: ToolPolicy, *, permissions: frozenset[str], roles: frozenset[str]) -> bool:
    if tool.permission not in permissions or not policy.enabled:
        return False
    return policy.allowed_roles is None or not policy.allowed_roles.isdisjoint(roles)


@dataclass(frozen=True, slots=True)
class ToolLimits:
    timeout_s: float | None
    max_result_bytes: int | None
    max_calls_per_run: int | None
    """The tenant's per-run cap on calls of this tool (the ``tool_budget`` guard); ``None``: no cap."""


MAX_POLICY_TIMEOUT_S = 600
"""The longest timeout a tenant's policy may give a tool (the admin API refuses more)."""


def longest_timeout_s(tools: Iterable[Tool], default_timeout_s: float) -> float:
    """The longest any call of these tools may run, whatever a tenant's policy says."""
    return float(max([default_timeout_s, MAX_POLICY_TIMEOUT_S, *(tool.timeout_s or 0.0 for tool in tools)]))


def tool_limits(tool: Tool, policy: ToolPolicy) -> ToolLimits:
    """The limits a call of ``tool`` runs under with this policy."""
    return ToolLimits(
        timeout_s=policy.timeout_s if policy.timeout_s is not None else tool.timeout_s,
        max_result_bytes=policy.max_result_bytes if policy.max_result_bytes is not None else tool.max_result_bytes,
        max_calls_per_run=policy.max_calls_per_run,
    )


def needs_approval(tool: Tool, policy: ToolPolicy) -> bool:
    mode = policy.approval_mode
    if mode is ApprovalMode.ALWAYS:
        return True
    if mode is ApprovalMode.NEVER and (policy.approval_waived or not tool.mutates):
        return False
    return tool.mutates


def runs_in_transaction(tool: Tool, policy: ToolPolicy) -> bool:
    """A tool that changes data and runs without approval runs in one transaction with
    its outcome and audit row (the transactional call of ``gateway.execution.transactional``)."""
    return tool.mutates and not needs_approval(tool, policy)
