"""Retention of runs: ``gateway runs prune --older-than AGE``.

A run that expired before ``now - AGE`` goes, with what is kept for it alone: its tool calls
and repeat counts (deleted here, by tenant and run), its messages, approvals and MCP token
binding (by their foreign keys' cascade). An expired run can do nothing more — no call is
admitted, no approval of it can be decided — so nothing is lost but its history, which the
audit chain keeps (its own retention is ``gateway audit prune``). A run with a call or an
approval still executing (admitted before the run expired) stays until that ends: its
outcome is still to be recorded, and a retry of the call must find it.

Runs go oldest expiry first, in batches of ``BATCH`` runs, each its own short transaction
(rows locked by a request are skipped, for the next prune), so a large backlog neither holds
locks for long nor builds one huge transaction. Each batch is audited in the same
transaction, in the chain of each tenant it removed runs of (``runs.prune``: how many runs
and tool calls, expired before when).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from collections import Counter

import sqlalchemy as sa
import structlog

from gateway.admin.operator import OPERATOR
from gateway.admin.service import append_admin_audit
from gateway.db.engine import Database

log = structlog.get_logger("gateway.admin.run_retention")

BATCH = 500

_PRUNE_BATCH = sa.text("""
WITH doomed AS (
    SELECT r.tenant_id, r.id
    FROM runs r
    WHERE r.expires_at < :cutoff
      AND NOT EXISTS (
          SELECT 1 FROM approvals a
          WHERE a.tenant_id = r.tenant_id AND a.run_id = r.id AND a.status = 'executing'
      )
      AND NOT EXISTS (
          SELECT 1 FROM tool_calls t
          WHERE t.tenant_id = r.tenant_id AND t.run_id = r.id AND t.status = 'executing'
      )
    ORDER BY r.expires_at
    LIMIT :batch
    FOR UPDATE OF r SKIP LOCKED
), calls AS (
    DELETE FROM tool_calls t USING doomed d WHERE t.tenant_id = d.tenant_id AND t.run_id = d.id
    RETURNING t.tenant_id
), counts AS (
    DELETE FROM run_call_counts c USING doomed d WHERE c.tenant_id = d.tenant_id AND c.run_id = d.id
    RETURNING 1
), gone AS (
    DELETE FROM runs r USING doomed d WHERE r.tenant_id = d.tenant_id AND r.id = d.id
    RETURNING r.tenant_id
)
SELECT tenant_id, sum(runs)::bigint AS runs, sum(calls)::bigint AS calls
FROM (SELECT tenant_id, 1 AS runs, 0 AS calls FROM gone UNION ALL SELECT tenant_id, 0, 1 FROM calls) AS removed
GROUP BY tenant_id
""")


async def prune_expired_runs(
    db: Database, *, older_than: timedelta, now: datetime | None = None
) -> dict[str, tuple[int, int]]:
    """Remove the runs that expired before ``now - older_than``: how many runs and tool calls
    went, by tenant."""
    cutoff = (now or datetime.now(UTC)) - older_than
    runs: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    while True:
        async with db.begin() as conn:
            batch = (await conn.execute(_PRUNE_BATCH, {"cutoff": cutoff, "batch": BATCH})).all()
            for row in batch:
                await append_admin_audit(
                    conn, tenant_id=row.tenant_id, user_id=OPERATOR, action="runs.prune", target=f"tenant:{row.tenant_id}",
                    before=None, after={"removed_runs": row.runs, "removed_tool_calls": row.calls,
                                        "expired_before": cutoff.isoformat()},
                    request_id=None,
                )
        for row in batch:
            runs[row.tenant_id] += row.runs
            calls[row.tenant_id] += row.calls
        if sum(row.runs for row in batch) < BATCH:
            break
    log.info("runs_pruned", runs=sum(runs.values()), tool_calls=sum(calls.values()), tenants=len(runs),
             expired_before=cutoff.isoformat())
    return {tenant: (runs[tenant], calls[tenant]) for tenant in runs}
