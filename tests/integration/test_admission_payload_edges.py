"""Payloads the ledger never builds, sent to the admission function straight: whichever way
it decides a statement (set-based or call by call), it answers as the loop answers."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import asyncpg
import pytest
import sqlalchemy as sa

from gateway.db.models import Run
from tests.integration.test_admission_paths import LOOP, START, stored

ROW = "o_batch, o_tool_call_id, o_decision, o_outcome, o_content, o_approval_id, o_approval_status"
CONTENTS = json.dumps({"REPEATED_CALL": "rep", "BUDGET_EXCEEDED": "bud", "RUN_EXPIRED": "exp",
                       "TOOL_CALL_ID_CONFLICT": "conf", "TOOL_BUDGET_EXCEEDED": "tbud"})


async def a_run(db) -> str:
    run_id = "run_" + uuid.uuid4().hex
    async with db.begin() as conn:
        await conn.execute(sa.insert(Run).values(
            id=run_id, tenant_id="acme", user_id="alice", max_tool_calls=100, max_repeats=2, used_tool_calls=0,
            expires_at=None, created_at=START))
    return run_id


def batch(run_id: str, call_ids: list[str], *, tenant: str | None = "acme", user: str | None = "alice") -> dict:
    return {
        "audit": {"tenant_id": tenant, "user_id": user, "run_id": run_id, "request_id": "r",
                  "created_at": START.isoformat()},
        "roles": [], "stale_before": (START - timedelta(minutes=20)).isoformat(),
        "approval_expires_at": (START + timedelta(hours=1)).isoformat(),
        "calls": [{"audit": {"tool_call_id": i, "tool": "add", "arguments": {"a": 1}, "arguments_sha256": "s" + i},
                   "call_hash": "h" + i} for i in call_ids],
    }


async def admitted(db, function: str, batches: list[dict]) -> list[tuple]:
    async with db.driver() as conn:
        try:
            async with conn.transaction():
                rows = await conn.fetch(f"SELECT {ROW} FROM {function}($1::jsonb, $2::jsonb)",
                                        json.dumps(batches), CONTENTS)
        except asyncpg.PostgresError as exc:
            return [("error", type(exc).__name__)]
    return [tuple(row) for row in rows]


@pytest.mark.parametrize("nobody", ["tenant", "user"])
async def test_a_batch_naming_no_owner_of_a_run_another_batch_owns_is_no_run(db, nobody: str):
    """min() and max() skip NULLs: a run must not pass for the caller's because one of its
    batches names nobody."""
    answers, rows = [], []
    for function in ("gateway_admit_calls", LOOP):
        run_id = await a_run(db)
        answers.append(await admitted(db, function, [batch(run_id, ["c1"]), batch(run_id, ["c2"], **{nobody: None})]))
        rows.append(await stored(db, [run_id]))
    assert answers[0] == answers[1]
    assert answers[0][1][:3] == (1, None, "no_run")
    assert rows[0] == rows[1]
