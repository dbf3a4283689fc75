"""Operator commands (CLI only, no HTTP surface): tenants and the audit chain.

    gateway tenants create SLUG [--name NAME]
    gateway tenants list
    gateway tenants disable SLUG | enable SLUG
    gateway tenants configure SLUG [--llm-provider NAME | --no-llm-provider] [--client-tools allow|refuse]
    gateway tenants approval-mode SLUG TOOL never|mutating|always
    gateway audit seal
    gateway audit verify --tenant T [--anchor FILE]
    gateway audit anchor --tenant T [--out FILE]
    gateway audit prune --older-than 90d
    gateway runs prune --older-than 30d

Changes to a tenant are audited in its own chain (user ``operator:cli``). A disabled
tenant's tokens get ``403 TENANT_DISABLED``, and a tenant's agent-loop settings apply, on
every gateway process within ``GATEWAY_POLICY_CACHE_S`` seconds.

The agent-loop settings are the operator's, not the tenant administrators': which model
provider a tenant's conversations go to decides where its data is sent, and tools a
client brings run outside the gateway's guards. So is letting a tool that changes data run
without approval (``approval-mode ... never``): the admin API refuses it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.admin.service import append_admin_audit
from gateway.audit.anchor import Anchor, sign_anchor
from gateway.audit.prune import prune
from gateway.audit.sealer import AuditSealer
from gateway.audit.verify import VerifyReport, verify_chain
from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.db.engine import Database
from gateway.db import policies as pq
from gateway.db.models import Tenant
from gateway.db.policies import DEFAULT_POLICY, ApprovalMode
from gateway.db.roles import lock_tenant
from gateway.db.tenants import create_tenant, ensure_role, set_agent_settings
from gateway.demo import ADMIN
from gateway.tools.registry import ToolRegistry

OPERATOR = "operator:cli"
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
PROVIDER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
tenants = Tenant.__table__


class OperatorError(Exception):
    """A command that cannot be carried out; the message says why."""


async def create(db: Database, slug: str, name: str | None) -> str:
    if not SLUG.fullmatch(slug):
        raise OperatorError(f"{slug!r} is not a valid tenant slug (lower-case letters, digits and '-', at most 64)")
    async with db.begin() as conn:
        if not await create_tenant(conn, tenant_id=slug, name=name or slug):
            raise OperatorError(f"tenant {slug!r} already exists")
        await ensure_role(
            conn, tenant_id=slug, name="admin",
            description="Administers the tenant: roles, tool policies, caps, approvals and the audit.",
            permissions=ADMIN,
        )
        await append_admin_audit(
            conn, tenant_id=slug, user_id=OPERATOR, action="tenant.create", target=f"tenant:{slug}", before=None,
            after={"id": slug, "name": name or slug, "roles": ["admin"]}, request_id=None,
        )
    return f"created tenant {slug} with an `admin` role ({', '.join(sorted(ADMIN))})"


async def list_all(db: Database) -> str:
    async with db.connect() as conn:
        rows = (await conn.execute(sa.select(tenants).order_by(tenants.c.id))).all()
    lines = [
        f"{'slug':<24} {'state':<9} {'max calls/run':>13} {'max repeats':>11} {'max run ttl s':>13}  "
        f"{'llm provider':<16} {'client tools':<12} name"
    ]
    for row in rows:
        state = "disabled" if row.disabled else "enabled"
        lines.append(
            f"{row.id:<24} {state:<9} {row.max_tool_calls_per_run:>13} {row.max_repeats_per_call:>11} "
            f"{row.max_run_ttl_s:>13}  {row.llm_provider or '-':<16} "
            f"{'allow' if row.allow_client_tools else 'refuse':<12} {row.name}"
        )
    return "\n".join(lines)


async def set_disabled(db: Database, slug: str, disabled: bool) -> str:
    async with db.begin() as conn:
        if not await lock_tenant(conn, tenant_id=slug):
            raise OperatorError(f"no tenant {slug!r}")
        before = bool(await conn.scalar(sa.select(tenants.c.disabled).where(tenants.c.id == slug)))
        if before != disabled:
            await conn.execute(sa.update(tenants).where(tenants.c.id == slug).values(disabled=disabled))
            await append_admin_audit(
                conn, tenant_id=slug, user_id=OPERATOR, action="tenant.disable" if disabled else "tenant.enable",
                target=f"tenant:{slug}", before={"disabled": before}, after={"disabled": disabled}, request_id=None,
            )
    return f"tenant {slug} is {'disabled' if disabled else 'enabled'}"


UNCHANGED = object()
"""For ``configure``: leave this setting as it is."""


async def configure(
    db: Database, slug: str, *, llm_provider: str | None | object = UNCHANGED, allow_client_tools: bool | None = None
) -> str:
    """Pin the tenant to a model provider (``None`` unpins it) and allow or refuse the tools
    a client brings to the agent loop; what is not given stays as it is."""
    if isinstance(llm_provider, str) and not PROVIDER_NAME.fullmatch(llm_provider):
        raise OperatorError(f"{llm_provider!r} is not a provider name (letters, digits, '.', '_', '-'; at most 64)")
    async with db.begin() as conn:
        if not await lock_tenant(conn, tenant_id=slug):
            raise OperatorError(f"no tenant {slug!r}")
        row = (await conn.execute(
            sa.select(tenants.c.llm_provider, tenants.c.allow_client_tools).where(tenants.c.id == slug)
        )).one()
        before = {"llm_provider": row.llm_provider, "allow_client_tools": bool(row.allow_client_tools)}
        after = dict(before)
        if llm_provider is not UNCHANGED:
            after["llm_provider"] = llm_provider
        if allow_client_tools is not None:
            after["allow_client_tools"] = allow_client_tools
        if after != before:
            await set_agent_settings(conn, tenant_id=slug, **after)
            await append_admin_audit(
                conn, tenant_id=slug, user_id=OPERATOR, action="tenant.configure", target=f"tenant:{slug}",
                before=before, after=after, request_id=None,
            )
    provider = after["llm_provider"] or "the gateway's default (none pinned)"
    tools = "allowed" if after["allow_client_tools"] else "refused"
    return f"tenant {slug}: model provider {provider}; client tools {tools}"


async def set_approval_mode(db: Database, slug: str, tool: str, mode: ApprovalMode, *, registry: ToolRegistry) -> str:
    """Set the approval mode of the tenant's policy for ``tool``, keeping its other fields;
    the one way to let a tool that changes data run without approval."""
    known = registry.get(tool)
    if known is None:
        raise OperatorError(f"no tool {tool!r} (the gateway's tools: {', '.join(t.name for t in registry)})")
    async with db.begin() as conn:
        if not await lock_tenant(conn, tenant_id=slug):
            raise OperatorError(f"no tenant {slug!r}")
        before = await pq.get_policy(conn, tenant_id=slug, tool=tool) or DEFAULT_POLICY
        after = replace(before, approval_mode=mode, approval_waived=mode is ApprovalMode.NEVER)
        if after != before:
            await pq.put_policy(
                conn, tenant_id=slug, tool=tool, policy=after, updated_by=OPERATOR, now=datetime.now(UTC)
            )
            await append_admin_audit(
                conn, tenant_id=slug, user_id=OPERATOR, action="tool_policy.approval_mode", target=f"tool:{tool}",
                before={**before.as_dict(), "approval_waived": before.approval_waived},
                after={**after.as_dict(), "approval_waived": after.approval_waived}, request_id=None, tool=tool,
            )
    effect = "calls run without approval" if mode is ApprovalMode.NEVER else f"approval mode {mode.value}"
    kind = "changes data" if known.mutates else "reads only"
    return f"tenant {slug}, tool {tool} ({kind}): {effect}"


async def seal(db: Database) -> str:
    sealed = await AuditSealer(db).seal_pending(wait=True)
    return f"sealed {sealed} audit row(s)"


@asynccontextmanager
async def _snapshot(db: Database, tenant_id: str) -> AsyncIterator[AsyncConnection]:
    """One consistent view of the tenant's chain: the sealers keep moving the head meanwhile."""
    async with db.connect() as conn:
        await conn.execution_options(isolation_level="REPEATABLE READ")
        if await conn.scalar(sa.select(tenants.c.id).where(tenants.c.id == tenant_id)) is None:
            raise OperatorError(f"no tenant {tenant_id!r}")
        yield conn


async def verify(db: Database, tenant_id: str, anchor: Anchor | None = None) -> tuple[bool, str]:
    async with _snapshot(db, tenant_id) as conn:
        report = await verify_chain(conn, tenant_id=tenant_id, anchor=anchor)
    return report.ok, report.describe()


async def anchor(
    db: Database, tenant_id: str, *, signer: ServiceTokenSigner, issuer: str
) -> tuple[str, VerifyReport]:
    """The tenant's sealed head, signed, once the chain up to it verifies."""
    async with _snapshot(db, tenant_id) as conn:
        report = await verify_chain(conn, tenant_id=tenant_id)
    if not report.ok:
        raise OperatorError(f"the chain does not verify, so it is not anchored: {report.describe()}")
    token = sign_anchor(
        signer, issuer=issuer, tenant_id=tenant_id, chain_seq=report.head_seq, chain_hash=report.head_hash,
        start_seq=report.anchor_seq, start_hash=report.start_hash, now=datetime.now(UTC),
    )
    return token, report


async def prune_runs(db: Database, age: timedelta) -> str:
    from gateway.admin.run_retention import prune_expired_runs

    removed = await prune_expired_runs(db, older_than=age)
    lines = [f"tenant {tenant}: removed {runs} run(s) and {calls} tool call(s)"
             for tenant, (runs, calls) in sorted(removed.items())]
    return "\n".join(lines) or "nothing to prune: no run expired that long ago"


async def prune_older_than(db: Database, age: timedelta) -> str:
    pruned = await prune(db, older_than=age)
    lines = [
        f"tenant {r.tenant_id}: removed {r.removed_rows} row(s); the chain now starts after position {r.anchor_seq}"
        for r in pruned.tenants
    ]
    if pruned.months:
        lines.append(f"dropped {len(pruned.months)} month(s): {', '.join(pruned.months)}")
    else:
        lines.append("nothing to prune: no month of audit rows is older than that")
    if pruned.kept_unsealed is not None:
        lines.append(f"kept {pruned.kept_unsealed} and later months: a row of it is not sealed yet")
    return "\n".join(lines)
