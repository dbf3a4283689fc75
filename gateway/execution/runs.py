"""Runs: a budgeted context for a model's tool calls, owned by one user of one tenant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.auth.directory import TenantDirectory
from gateway.auth.principal import Principal
from gateway.db import agent_runs
from gateway.db import runs as run_queries
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class RequestedLimits:
    max_tool_calls: int | None = None
    max_repeats: int | None = None
    expires_at: datetime | None = None


class RunService:
    def __init__(self, *, settings: Settings, db: Database, directory: TenantDirectory) -> None:
        self._settings = settings
        self._db = db
        self._directory = directory

    async def create(
        self, principal: Principal, requested: RequestedLimits, *, columns: Mapping[str, Any] | None = None
    ) -> Any:
        """Limits default from settings and are clamped by the tenant's caps.

        ``columns`` are stored with the run in the same statement (an agent run's loop state).
        """
        tenant = await self._directory.get(principal.tenant_id)
        if tenant is None:
            raise GatewayError(ErrorCode.UNAUTHENTICATED)
        now = datetime.now(UTC)
        max_tool_calls = min(requested.max_tool_calls or self._settings.runs.max_tool_calls,
                             tenant.max_tool_calls_per_run)
        max_repeats = min(requested.max_repeats or self._settings.runs.max_repeats, tenant.max_repeats_per_call)
        latest = now + timedelta(seconds=tenant.max_run_ttl_s)
        expires_at = requested.expires_at
        if expires_at is not None:
            if expires_at.tzinfo is None:
                raise GatewayError(ErrorCode.INVALID_REQUEST, "expires_at must carry a time zone (e.g. Z).")
            if expires_at <= now:
                raise GatewayError(ErrorCode.INVALID_REQUEST, "expires_at must be in the future.")
            expires_at = min(expires_at.astimezone(UTC), latest)
        else:
            expires_at = min(now + timedelta(seconds=self._settings.runs.ttl_s), latest)
        async with self._db.begin() as conn:
            return await run_queries.create_run(
                conn,
                tenant_id=principal.tenant_id,
                user_id=principal.user_id,
                max_tool_calls=max_tool_calls,
                max_repeats=max_repeats,
                expires_at=expires_at,
                now=now,
                columns=columns,
            )

    async def get(self, principal: Principal, run_id: str) -> Any:
        """A run of another user or tenant is not found."""
        async with self._db.connect() as conn:
            row = await run_queries.get_run(
                conn, tenant_id=principal.tenant_id, user_id=principal.user_id, run_id=run_id
            )
        if row is None:
            raise GatewayError(ErrorCode.NOT_FOUND, "No such run.")
        return row

    async def history(self, principal: Principal, run_id: str) -> list[dict[str, Any]]:
        """The messages of an agent run's history, in order (none for a client-driven run)."""
        async with self._db.connect() as conn:
            return await agent_runs.load_messages(conn, tenant_id=principal.tenant_id, run_id=run_id)
