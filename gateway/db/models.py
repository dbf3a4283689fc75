"""The tables, as SQLAlchemy models.

The schema itself lives in the Alembic migrations; these models mirror it for queries,
and a test runs ``alembic check`` to keep the two in agreement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gateway.db.types import BigIntId, JsonValue, UtcDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    disabled: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())
    max_tool_calls_per_run: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("100000"))
    max_repeats_per_call: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("100"))
    max_run_ttl_s: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("2592000"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # The agent loop: may a request bring its own tools; the model provider the tenant is pinned to.
    allow_client_tools: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())
    llm_provider: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)


class Role(Base):
    __tablename__ = "roles"

    tenant_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    description: Mapped[str] = mapped_column(sa.String(500), server_default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class RolePermission(Base):
    __tablename__ = "role_permissions"
    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["tenant_id", "role"], ["roles.tenant_id", "roles.name"], ondelete="CASCADE"
        ),
    )

    tenant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    role: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    permission: Mapped[str] = mapped_column(sa.String(128), primary_key=True)


class User(Base):
    """The tenant's user directory. Identity still comes only from the token; this table
    names users and holds the roles `gateway token` puts in a development token."""

    __tablename__ = "users"

    tenant_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    display_name: Mapped[str] = mapped_column(sa.String(200), server_default="")
    roles: Mapped[list[str]] = mapped_column(JsonValue)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class Run(Base):
    """A run: its budget and, for an agent run, its loop. Keyed by tenant first, as every table
    of the hot path (migration 0020): a run id is unique within its tenant."""

    __tablename__ = "runs"
    __table_args__ = (
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_runs"),
        sa.Index(None, "tenant_id", "user_id", "created_at"),
        sa.Index(None, "expires_at"),  # retention (gateway.admin.run_retention), across tenants
    )

    id: Mapped[str] = mapped_column(sa.String(40))
    tenant_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    user_id: Mapped[str] = mapped_column(sa.String(128))
    max_tool_calls: Mapped[int] = mapped_column(sa.Integer)
    max_repeats: Mapped[int] = mapped_column(sa.Integer)
    used_tool_calls: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("0"))
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # The agent loop's state; empty for a run a client drives through /tool-calls.
    loop_state: Mapped[str | None] = mapped_column(sa.String(24), nullable=True)
    stop_reason: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    provider: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    model: Mapped[str | None] = mapped_column(sa.String(200), nullable=True)
    max_steps: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    max_total_tokens: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    timeout_s: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    steps: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("0"))
    prompt_tokens: Mapped[int] = mapped_column(sa.BigInteger, server_default=sa.text("0"))
    completion_tokens: Mapped[int] = mapped_column(sa.BigInteger, server_default=sa.text("0"))
    messages_dropped: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("0"))
    loop_options: Mapped[dict[str, Any] | None] = mapped_column(JsonValue, nullable=True)
    updated_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class RunMessage(Base):
    """One message of an agent run's history, in the OpenAI chat format, in order."""

    __tablename__ = "run_messages"
    __table_args__ = (
        sa.PrimaryKeyConstraint("tenant_id", "run_id", "seq", name="pk_run_messages"),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"], ondelete="CASCADE"),
    )

    run_id: Mapped[str] = mapped_column(sa.String(40))
    seq: Mapped[int] = mapped_column(sa.Integer)
    tenant_id: Mapped[str] = mapped_column(sa.String(64))
    message: Mapped[dict[str, Any]] = mapped_column(JsonValue)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class RunCallCount(Base):
    """How often one exact call (tool + canonical arguments) was made in a run."""

    __tablename__ = "run_call_counts"

    # No foreign keys on the hot path's tables: see migration 0001.
    tenant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    call_hash: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    count: Mapped[int] = mapped_column(sa.Integer)


class McpTokenRun(Base):
    """The default run of an MCP caller without a session (protocol 2026-07-28): one per
    tenant, user and token (its ``jti``, or the sha256 of the token), expiring with the token."""

    __tablename__ = "mcp_token_runs"
    __table_args__ = (
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    token_key: Mapped[str] = mapped_column(sa.String(80), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.String(40))
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ToolCall(Base):
    """One tool_call_id of a run and what was answered for it, so a retried batch is
    answered from here instead of executing again."""

    __tablename__ = "tool_calls"
    __table_args__ = (sa.PrimaryKeyConstraint("tenant_id", "run_id", "tool_call_id", name="pk_tool_calls"),)

    run_id: Mapped[str] = mapped_column(sa.String(40))
    tool_call_id: Mapped[str] = mapped_column(sa.String(128))
    tenant_id: Mapped[str] = mapped_column(sa.String(64))
    tool: Mapped[str] = mapped_column(sa.String(128))
    status: Mapped[str] = mapped_column(sa.String(16))
    outcome: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    content: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    approval_id: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    arguments_sha256: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    """The call's arguments hash (of the canonical arguments, or of the raw text when they did
    not decode): a later call with this id is a replay only when tool and hash match.
    NULL only for a call stored before migration 0006 whose audit row was gone."""


class Approval(Base):
    __tablename__ = "approvals"
    __table_args__ = (
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_approvals"),
        sa.UniqueConstraint("tenant_id", "run_id", "tool_call_id"),
        sa.ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.id"], ondelete="CASCADE"),
        sa.Index(None, "tenant_id", "status", "created_at"),
    )

    id: Mapped[str] = mapped_column(sa.String(40))
    tenant_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(sa.String(40))
    tool_call_id: Mapped[str] = mapped_column(sa.String(128))
    requester_id: Mapped[str] = mapped_column(sa.String(128))
    requester_roles: Mapped[list[str]] = mapped_column(JsonValue)
    tool: Mapped[str] = mapped_column(sa.String(128))
    canonical_arguments: Mapped[str] = mapped_column(sa.Text)
    """The frozen call's canonical JSON, as text: what ``arguments_sha256`` hashes and exactly
    what executes (JSONB would rewrite numbers such as ``1e16`` or ``-0.0``)."""
    arguments_sha256: Mapped[str] = mapped_column(sa.String(64))
    status: Mapped[str] = mapped_column(sa.String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    decided_by: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    decided_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    reason: Mapped[str | None] = mapped_column(sa.String(1000), nullable=True)
    outcome: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    outcome_content: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class Article(Base):
    __tablename__ = "articles"
    __table_args__ = (sa.Index(None, "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    author_id: Mapped[str] = mapped_column(sa.String(128))
    title: Mapped[str] = mapped_column(sa.String(200))
    body: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class AuditEvent(Base):
    """Insert-only, enforced by triggers (``gateway/db/sql/audit_insert_only.sql``): every
    UPDATE and DELETE is refused. Partitioned by RANGE of ``created_at``, one partition per
    UTC month and a DEFAULT one (``gateway/db/sql/audit_partitions.sql``, migration 0013);
    retention drops whole months. Written through ``gateway.audit.rows``; linked into its
    tenant's chain by a row of ``audit_links``."""

    __tablename__ = "audit_events"
    __table_args__ = (
        # The partition key is part of every unique constraint; lookups by id name the tenant.
        sa.PrimaryKeyConstraint("tenant_id", "id", "created_at", name="pk_audit_events"),
        sa.Index(None, "tenant_id", "run_id"),
        # The sealer's work list: rows in the order their transactions were given ids.
        sa.Index(None, "txid", "id"),
        {"postgresql_partition_by": "RANGE (created_at)"},
    )

    id: Mapped[int] = mapped_column(BigIntId, sa.Identity())
    tenant_id: Mapped[str] = mapped_column(sa.String(64))
    kind: Mapped[str] = mapped_column(sa.String(32))
    user_id: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    run_id: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    tool_call_id: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    tool: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    arguments: Mapped[Any | None] = mapped_column(JsonValue, nullable=True)
    arguments_sha256: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    outcome: Mapped[str] = mapped_column(sa.String(40))
    duration_ms: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    approval_id: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    request_id: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    error_id: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JsonValue, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # The inserting transaction's id (pg_current_xact_id() as a number): the sealer seals
    # the rows of finished transactions in (txid, id) order (gateway.audit.sealer).
    txid: Mapped[int] = mapped_column(
        BigIntId, server_default=sa.text("(pg_current_xact_id())::text::bigint")
    )


class AuditLink(Base):
    """A sealed row's place in its tenant's chain, written once by the sealer; deleted only
    behind the tenant's anchor (by the prune, with the month of its row)."""

    __tablename__ = "audit_links"
    # The audited row's whole key: ids alone are unique only by the sequence's habit, and two
    # rows sharing an id (one inserted with an explicit id) must still get a link each.
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "audit_id", "created_at"),
        sa.CheckConstraint("hash_version IN (1, 2)", name="hash_version"),
    )

    tenant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    chain_seq: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    audit_id: Mapped[int] = mapped_column(BigIntId)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    """The audited row's ``created_at`` (its partition key)."""
    content_hash: Mapped[str] = mapped_column(sa.String(64))
    prev_hash: Mapped[str] = mapped_column(sa.String(64))
    chain_hash: Mapped[str] = mapped_column(sa.String(64))
    hash_version: Mapped[int] = mapped_column(sa.SmallInteger, server_default=sa.text("1"))
    """How ``chain_hash`` was made (``gateway.audit.chain.link_hash``): 2 covers ``created_at``
    too; 1, links sealed before migration 0022, does not. The default is 1 so that a sealer of
    the release before, still running during an upgrade, writes what it hashed."""


class AuditSealState(Base):
    """The sealer's watermark (one row): every audit row at or below ``(txid, audit_id)`` is
    sealed, none above it."""

    __tablename__ = "audit_seal_state"
    __table_args__ = (sa.CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(sa.SmallInteger, primary_key=True)
    txid: Mapped[int] = mapped_column(BigIntId)
    audit_id: Mapped[int] = mapped_column(BigIntId)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class AuditChain(Base):
    """A tenant's chain: its head (the last sealed row) and its anchor (where it starts
    after pruning: the chain hash of the last pruned row, or the genesis hash)."""

    __tablename__ = "audit_chains"

    tenant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    head_seq: Mapped[int] = mapped_column(BigIntId)
    head_hash: Mapped[str] = mapped_column(sa.String(64))
    anchor_seq: Mapped[int] = mapped_column(BigIntId)
    anchor_hash: Mapped[str] = mapped_column(sa.String(64))
    start_prev_hash: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    start_content_hash: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    start_linked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    start_hash_version: Mapped[int | None] = mapped_column(sa.SmallInteger, nullable=True)
    """The link a prune removed at the chain's start (``anchor_seq``): ``anchor_hash`` is its
    chain hash, and its time lies in a dropped month (migration 0024). NULL at the genesis, and
    for a start an earlier release moved."""
    pruned_rows: Mapped[int] = mapped_column(BigIntId, server_default=sa.text("0"))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ToolPolicyRow(Base):
    """A tenant's policy for one tool; a tool without a row has the default policy."""

    __tablename__ = "tool_policies"
    __table_args__ = (
        sa.CheckConstraint("approval_mode IN ('never', 'mutating', 'always')", name="approval_mode"),
    )

    tenant_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    tool: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    enabled: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.true())
    approval_mode: Mapped[str] = mapped_column(sa.String(16), server_default="mutating")
    timeout_s: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    max_calls_per_run: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    max_result_bytes: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    allowed_roles: Mapped[list[str] | None] = mapped_column(JsonValue, nullable=True)
    approval_waived: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())
    """Set by the operator's ``approval-mode never`` only (migration 0025)."""
    updated_by: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class RateLimitBucket(Base):
    """One shared token bucket: a tenant's (``user_id = ''``) or one user's of a tenant.
    Processes lease tokens from it in small chunks (``gateway.ratelimit``)."""

    __tablename__ = "rate_limit_buckets"

    tenant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    tokens: Mapped[float] = mapped_column(sa.Float)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class RateLimitOverride(Base):
    """A tenant's own rate and burst, replacing the configured ones for the scope
    ``tenant`` (its own bucket) or ``user`` (each of its users' buckets)."""

    __tablename__ = "rate_limit_overrides"
    __table_args__ = (
        sa.CheckConstraint("scope IN ('tenant', 'user')", name="scope"),
        sa.CheckConstraint("rate_per_s > 0", name="rate_positive"),
        sa.CheckConstraint("burst >= 1", name="burst_positive"),
    )

    tenant_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    scope: Mapped[str] = mapped_column(sa.String(8), primary_key=True)
    rate_per_s: Mapped[float] = mapped_column(sa.Float)
    burst: Mapped[int] = mapped_column(sa.Integer)


class ConsoleSession(Base):
    """A signed-in console user: the browser holds a random value in a cookie, the table only
    its sha256, so a copy of the table signs no one in. Ends at ``expires_at`` (absolute) or
    after the configured idle time since ``last_seen_at``, or on sign-out (row deleted)."""

    __tablename__ = "console_sessions"
    __table_args__ = (sa.Index(None, "expires_at"),)

    id_hash: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    user_id: Mapped[str] = mapped_column(sa.String(128))
    roles: Mapped[list[str]] = mapped_column(JsonValue)
    csrf_token: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ConsoleSignIn(Base):
    """No longer written: an OpenID Connect sign-in under way lives in its browser's cookie
    (``gateway.console.oidc``). Kept while the release before, which writes it, may still
    serve beside this one during a rollout; a later release drops it."""

    __tablename__ = "console_sign_ins"

    state_hash: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    nonce: Mapped[str] = mapped_column(sa.String(64))
    code_verifier: Mapped[str] = mapped_column(sa.String(128))
    browser_hash: Mapped[str] = mapped_column(sa.String(64))
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)


class WebhookSubscription(Base):
    """A tenant's webhook: where its events go (``gateway.webhooks``). The secret signs each
    delivery, so it is kept as given out (shown once, never returned or logged again)."""

    __tablename__ = "webhook_subscriptions"
    __table_args__ = (
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_webhook_subscriptions"),
        sa.CheckConstraint("format IN ('standard', 'slack')", name="format"),
    )

    id: Mapped[str] = mapped_column(sa.String(40))
    tenant_id: Mapped[str] = mapped_column(sa.String(64), sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(sa.String(2000))
    events: Mapped[list[str]] = mapped_column(JsonValue)
    format: Mapped[str] = mapped_column(sa.String(16))
    description: Mapped[str] = mapped_column(sa.String(500), server_default="")
    secret: Mapped[str] = mapped_column(sa.String(100))
    created_by: Mapped[str] = mapped_column(sa.String(128))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class WebhookDelivery(Base):
    """The outbox: one event for one subscription, written by a trigger in the transaction of
    the change it announces; its id is the ``webhook-id`` of every attempt."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.CheckConstraint("state IN ('pending', 'in_flight', 'delivered', 'dead')", name="state"),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_webhook_deliveries"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "subscription_id"], ["webhook_subscriptions.tenant_id", "webhook_subscriptions.id"],
            ondelete="CASCADE", name="fk_webhook_deliveries_tenant_id_subscription_id",
        ),
        # The worker's due list, across tenants.
        sa.Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),
        # Each tenant's deliveries not yet sent, oldest due first: the worker's claim (migration 0021).
        sa.Index(
            "ix_webhook_deliveries_tenant_due", "tenant_id", "next_attempt_at", "id",
            postgresql_where=sa.text("state IN ('pending', 'in_flight')"),
        ),
        sa.Index("ix_webhook_deliveries_subscription", "tenant_id", "subscription_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(sa.String(40))
    tenant_id: Mapped[str] = mapped_column(sa.String(64))
    subscription_id: Mapped[str] = mapped_column(sa.String(40))
    event_type: Mapped[str] = mapped_column(sa.String(40))
    data: Mapped[dict[str, Any]] = mapped_column(JsonValue)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    state: Mapped[str] = mapped_column(sa.String(16), server_default="pending")
    attempts: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("0"))
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime)
    """When it is due: the next retry, or (in flight) when its lease runs out."""
    window_started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    """Retries go on until this plus the retry window; a manual retry starts a new window."""
    last_attempt_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    last_status: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    dead_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
