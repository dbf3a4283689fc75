"""What the guard tests share: a registry of the built-in tools, callers, and a call's plan."""

from __future__ import annotations

from gateway.auth.principal import Principal
from gateway.db.policies import TenantPolicies, ToolPolicy
from gateway.demo import EDITOR, MEMBER
from gateway.execution.checks import CallPlan
from gateway.execution.guards import CheckContext
from gateway.execution.protocol import ToolCallRequest
from gateway.text import DEFAULT_MAX_JSON_DEPTH
from gateway.tools.builtin import builtin_tools
from gateway.tools.registry import ToolRegistry

REGISTRY = ToolRegistry(builtin_tools())
MEMBER_PRINCIPAL = Principal(tenant_id="acme", user_id="alice", roles=frozenset({"member"}), permissions=MEMBER)
EDITOR_PRINCIPAL = Principal(tenant_id="acme", user_id="bob", roles=frozenset({"editor"}), permissions=EDITOR)


def with_policies(principal: Principal, **policies: ToolPolicy) -> Principal:
    return Principal(
        tenant_id=principal.tenant_id, user_id=principal.user_id, roles=principal.roles,
        permissions=principal.permissions, tool_policies=TenantPolicies(policies),
    )


def context(principal: Principal = MEMBER_PRINCIPAL, *, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> CheckContext:
    return CheckContext(REGISTRY, principal, max_json_depth)


def plan(name: str, arguments: bytes = b"{}", *, decoded: bool = False) -> CallPlan:
    """A plan as the guards before this one leave it: the tool found (and the arguments decoded)."""
    request = ToolCallRequest(id="call_1", name=name, arguments=arguments)
    tool = REGISTRY.get(name)
    return CallPlan(request=request, tool=tool,
                    arguments=tool.arguments.decode(arguments) if decoded and tool is not None else None)
