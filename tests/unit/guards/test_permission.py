"""The ``permission`` guard: PERMISSION_DENIED unless the one visibility rule lets the caller
see the tool, so what is listed is exactly what may be called."""

from __future__ import annotations

from gateway.db.policies import ToolPolicy
from gateway.errors import ErrorCode
from gateway.execution.guards import permission
from tests.unit.guards.support import EDITOR_PRINCIPAL, MEMBER_PRINCIPAL, REGISTRY, context, plan, with_policies


def test_a_tool_the_roles_do_not_grant_is_refused_without_its_schema():
    refusal = permission.check(plan("delete_article"), context(MEMBER_PRINCIPAL))
    assert refusal == "You are not allowed to use 'delete_article'."
    assert "article_id" not in refusal and permission.GUARD.code is ErrorCode.PERMISSION_DENIED


def test_a_granted_tool_passes():
    assert permission.check(plan("delete_article"), context(EDITOR_PRINCIPAL)) is None


def test_a_tool_the_tenant_disabled_or_kept_from_these_roles_is_refused():
    disabled = with_policies(EDITOR_PRINCIPAL, add=ToolPolicy(enabled=False))
    other_roles = with_policies(EDITOR_PRINCIPAL, add=ToolPolicy(allowed_roles=frozenset({"admin"})))
    assert permission.check(plan("add"), context(disabled)) is not None
    assert permission.check(plan("add"), context(other_roles)) is not None


def test_what_is_called_is_exactly_what_is_listed():
    callers = (
        MEMBER_PRINCIPAL,
        EDITOR_PRINCIPAL,
        with_policies(EDITOR_PRINCIPAL, add=ToolPolicy(enabled=False), get_article=ToolPolicy(allowed_roles=frozenset())),
    )
    for principal in callers:
        listed = {t.name for t in REGISTRY.visible_to(principal.permissions, roles=principal.roles,
                                                      policies=principal.tool_policies)}
        callable_ = {t.name for t in REGISTRY if permission.allows(principal, t)}
        assert listed == callable_
