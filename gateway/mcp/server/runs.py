"""Which run an MCP call counts against.

1. A run of the caller's named in ``params._meta["gateway/run_id"]`` (another user's or
   tenant's run is not found, as on the REST route).
2. With the ``initialize`` handshake: the session's run. The ``Mcp-Session-Id`` is the id
   of the run created at ``initialize`` with the tenant's defaults, so the session's state
   is in PostgreSQL and every gateway process serves every session; a session id naming
   no run of the caller is not found.
3. On 2026-07-28 (no sessions): the caller's default run for the token: one per tenant,
   user and token (its ``jti``, or the sha256 of the token without one), created on first
   use and expiring with the token (table ``mcp_token_runs``). Once found, a process keeps
   it in memory until it expires (the mapping never changes while it lives).
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from gateway.auth.principal import Principal
from gateway.db.engine import Database
from gateway.db.models import McpTokenRun
from gateway.execution.runs import RequestedLimits, RunService

token_runs = McpTokenRun.__table__


class _Payload(msgspec.Struct):
    exp: int | float
    jti: str | None = None


_payload = msgspec.json.Decoder(_Payload)


def token_identity(token: str) -> tuple[str, datetime]:
    """The key of a verified token's default run, and when the token expires.

    Read from the token's payload without checking it again: the authentication
    middleware verified this very token for this request."""
    try:
        segment = token.split(".")[1]
        payload = _payload.decode(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
        expires = datetime.fromtimestamp(float(payload.exp), UTC)
    except (IndexError, ValueError, OverflowError, OSError, msgspec.DecodeError):
        raise ValueError("not a readable token") from None
    if payload.jti:
        key = "jti:" + hashlib.sha256(payload.jti.encode("utf-8", "surrogatepass")).hexdigest()
    else:
        key = "token:" + hashlib.sha256(token.encode()).hexdigest()
    return key, expires


class McpRuns:
    def __init__(self, *, db: Database, runs: RunService, max_cached: int = 10_000) -> None:
        self._db = db
        self._runs = runs
        self._cache: dict[tuple[str, str, str], tuple[str, datetime]] = {}
        self._max_cached = max_cached

    async def session_run(self, principal: Principal) -> str:
        """A new run with the tenant's defaults: the run of a new ``initialize`` session."""
        row = await self._runs.create(principal, RequestedLimits())
        return str(row.id)

    async def token_run(self, principal: Principal, token: str) -> str:
        key, token_expires = token_identity(token)
        now = datetime.now(UTC)
        if token_expires <= now:
            # Past its exp, still accepted within the clock-skew leeway: its run expired with it.
            raise ValueError("the token has expired")
        cache_key = (principal.tenant_id, principal.user_id, key)
        cached = self._cache.get(cache_key)
        if cached is not None and cached[1] > now:
            return cached[0]
        where = (
            token_runs.c.tenant_id == principal.tenant_id,
            token_runs.c.user_id == principal.user_id,
            token_runs.c.token_key == key,
            token_runs.c.expires_at > now,
        )
        async with self._db.connect() as conn:
            found = (await conn.execute(sa.select(token_runs.c.run_id, token_runs.c.expires_at).where(*where))).first()
        if found is None:
            found = await self._create(principal, key, token_expires, now)
        run_id, expires_at = str(found[0]), found[1]
        if len(self._cache) >= self._max_cached:
            self._cache.clear()
        self._cache[cache_key] = (run_id, expires_at)
        return run_id

    async def _create(self, principal: Principal, key: str, token_expires: datetime, now: datetime) -> tuple[str, datetime]:
        """Create the run and claim the key; when another process claimed it first, its run wins
        (the run made here stays unused and expires)."""
        row = await self._runs.create(principal, RequestedLimits(expires_at=token_expires))
        expires_at = row.expires_at or token_expires
        statement = insert(token_runs).values(
            tenant_id=principal.tenant_id,
            user_id=principal.user_id,
            token_key=key,
            run_id=row.id,
            expires_at=expires_at,
            created_at=now,
        )
        statement = statement.on_conflict_do_update(
            index_elements=[token_runs.c.tenant_id, token_runs.c.user_id, token_runs.c.token_key],
            set_={"run_id": row.id, "expires_at": expires_at, "created_at": now},
            where=token_runs.c.expires_at <= now,
        ).returning(token_runs.c.run_id, token_runs.c.expires_at)
        async with self._db.begin() as conn:
            claimed = (await conn.execute(statement)).first()
            if claimed is None:
                claimed = (
                    await conn.execute(
                        sa.select(token_runs.c.run_id, token_runs.c.expires_at).where(
                            token_runs.c.tenant_id == principal.tenant_id,
                            token_runs.c.user_id == principal.user_id,
                            token_runs.c.token_key == key,
                        )
                    )
                ).first()
        assert claimed is not None
        return str(claimed[0]), claimed[1]
