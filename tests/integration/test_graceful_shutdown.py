"""SIGTERM in the middle of a load: the process stops taking requests, lets the calls in
flight finish, and every acknowledged call has its audit row."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import seeded
from tests.support.calls import batch, contents, outcome, tool_call
from tests.support.processes import gateway_env, start_gateway, wait_until_ready
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres

CLIENTS = 12
CALLS_PER_REQUEST = 4
SIGNAL_AFTER = 40
"""Acknowledged requests before SIGTERM is sent."""


async def test_sigterm_mid_load_loses_no_audit_row_of_an_acknowledged_call(pg_url: str, tmp_path: Path) -> None:
    await seeded(pg_url)
    # A load test: its one user sends far more than the default rate limits allow.
    env = gateway_env(pg_url, rate_limit_user_rps=0, rate_limit_tenant_rps=0)
    gateway = start_gateway(env, tmp_path / "gateway.log", "--no-migrate")
    try:
        await asyncio.to_thread(wait_until_ready, gateway)
        headers = auth_for("alice")
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
            run = (await client.post("/v1/runs", json={"max_tool_calls": 100_000}, headers=headers)).json()["id"]
            acknowledged: list[str] = []
            enough = asyncio.Event()
            refused_after_signal = 0

            async def load(worker: int) -> None:
                nonlocal refused_after_signal
                for n in range(10_000):  # bounded; ends when the server stops answering
                    calls = [
                        tool_call("add", {"a": worker, "b": n * CALLS_PER_REQUEST + i}, call_id=f"w{worker}-{n}-{i}")
                        for i in range(CALLS_PER_REQUEST)
                    ]
                    try:
                        response = await client.post(f"/v1/runs/{run}/tool-calls", json=batch(*calls), headers=headers)
                    except httpx.TransportError:
                        refused_after_signal += 1
                        return
                    if response.status_code != 200:
                        return
                    assert [outcome(c) for c in contents(response.json())] == ["OK"] * CALLS_PER_REQUEST
                    acknowledged.extend(c["id"] for c in calls)
                    if len(acknowledged) >= SIGNAL_AFTER * CALLS_PER_REQUEST:
                        enough.set()

            loads = [asyncio.create_task(load(w)) for w in range(CLIENTS)]
            await asyncio.wait_for(enough.wait(), timeout=60)
            gateway.process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(asyncio.gather(*loads), timeout=60)
        exit_code = await asyncio.to_thread(gateway.process.wait, 60)
    finally:
        gateway.stop()

    # uvicorn re-raises the signal once it has shut down cleanly: the exit status says SIGTERM.
    assert exit_code in (0, -signal.SIGTERM)
    assert refused_after_signal > 0  # it stopped taking requests while the load went on
    conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        audited = {
            row["tool_call_id"]: row["outcome"]
            for row in await conn.fetch(
                "SELECT tool_call_id, outcome FROM audit_events WHERE run_id = $1 AND kind = 'tool_call'", run
            )
        }
        unfinished = await conn.fetchval(
            "SELECT count(*) FROM tool_calls WHERE run_id = $1 AND status <> 'done'", run
        )
        stored = await conn.fetchval("SELECT count(*) FROM tool_calls WHERE run_id = $1", run)
    finally:
        await conn.close()
    assert all(audited.get(call_id) == "OK" for call_id in acknowledged)
    # Calls that were in flight when the signal came finished and were audited too.
    assert unfinished == 0
    assert len(audited) == stored >= len(acknowledged)
    (stopped,) = [e for e in gateway.log_events() if e["event"] == "gateway_stopped"]
    assert stopped["drained"] is True
