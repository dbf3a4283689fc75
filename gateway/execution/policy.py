"""How a tenant's tool policy shapes what a caller sees and how a call runs.

One place decides, for the tool list and for execution alike:
- visibility: the caller's roles grant the tool's permission, the tool is enabled, and
  (when the policy names roles) one of the caller's roles is allowed. A tool that fails
  this is neither listed nor callable (``PERMISSION_DENIED``, never ``TOOL_NOT_FOUND``).
- approval: ``never``, ``mutating`` (tools that change data) or ``always``.
- limits: the policy's timeout and maximum result size replace the tool's; its per-run
  cap travels on the ``CallPlan`` for the ledger to enforce.
"""

from __future__ import annotations

from gateway.db.policies import ApprovalMode, ToolPolicy
from gateway.tools.base import Tool


def is_visible(tool: Tool, policy: ToolPolicy, *, permissions: frozenset[str], roles: frozenset[str]) -> bool:
    if tool.permission not in permissions or not policy.enabled:
        return False
    return policy.allowed_roles is None or not policy.allowed_roles.isdisjoint(roles)


def needs_approval(tool: Tool, policy: ToolPolicy) -> bool:
    mode = policy.approval_mode
    if mode is ApprovalMode.ALWAYS:
        return True
    if mode is ApprovalMode.NEVER:
        return False
    return tool.mutates


def runs_in_transaction(tool: Tool, policy: ToolPolicy) -> bool:
    """A tool that changes data and runs without approval runs in one transaction with
    its outcome and audit row (the transactional call of ``gateway.execution.transactional``)."""
    return tool.mutates and not needs_approval(tool, policy)
