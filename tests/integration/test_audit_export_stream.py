"""The audit export streams: memory stays flat over 100 000 rows, and a client that goes
away releases the export's database connection. Measured on a real gateway process."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import seeded
from tests.support.processes import gateways
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres

FILL = """
INSERT INTO audit_events (tenant_id, kind, user_id, run_id, tool_call_id, tool, arguments, arguments_sha256,
                          outcome, duration_ms, request_id, detail, created_at)
SELECT 'acme', 'tool_call', 'u' || (i % 100), 'run_' || (i % 1000), 'call_' || i, 'search_articles',
       jsonb_build_object('query', repeat('expense policy ', 12), 'limit', i % 50),
       md5(i::text) || md5((i + 1)::text), 'OK', 1.5, 'req_' || md5(i::text),
       jsonb_build_object('note', repeat('x', 60)), now() - (i || ' milliseconds')::interval
  FROM generate_series(1, $1) AS i
"""


async def _fill(pg_url: str, rows: int) -> None:
    conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(FILL, rows)
    finally:
        await conn.close()


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


async def _export(http: httpx.AsyncClient, base: str, **params: str) -> tuple[int, int]:
    """Stream the export, keeping nothing: (bytes, lines)."""
    size = lines = 0
    async with http.stream("GET", f"{base}/v1/admin/audit/export", params=params, headers=auth_for("carol")) as r:
        assert r.status_code == 200
        async for chunk in r.aiter_bytes():
            size += len(chunk)
            lines += chunk.count(b"\n")
    return size, lines


async def test_exporting_100_000_rows_keeps_the_gateways_memory_flat(pg_url):
    await seeded(pg_url)
    await _fill(pg_url, 100_000)
    with gateways(pg_url, 1, audit_seal_interval_s=0) as (gateway,):
        async with httpx.AsyncClient(timeout=120) as http:
            # Warm up every code path on a filtered export of 1 000 rows first.
            assert (await _export(http, gateway.url, user="u7"))[1] == 1_000
            before = _memory_kib(gateway.pid)
            size, lines = await _export(http, gateway.url)
            after = _memory_kib(gateway.pid)
    assert lines == 100_000
    peak_growth_kib = after["VmHWM"] - before["VmHWM"]
    print(f"export: {size / 2**20:.1f} MiB in {lines} rows; peak RSS {before['VmHWM'] / 1024:.1f} -> "
          f"{after['VmHWM'] / 1024:.1f} MiB (+{peak_growth_kib / 1024:.1f} MiB)")
    assert size > 40 * 2**20
    # Holding the rows (or the body) would cost several times the body's size; streaming
    # costs a few chunks of 1 000 rows.
    assert peak_growth_kib * 1024 < size / 4
    assert peak_growth_kib < 24 * 1024


async def _export_backends(admin_dsn: str, database: str) -> list[str]:
    conn = await asyncpg.connect(admin_dsn)
    try:
        rows = await conn.fetch(
            "SELECT state FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() "
            "AND query ILIKE '%FROM audit_events%'",
            database,
        )
    finally:
        await conn.close()
    return [row["state"] for row in rows]


async def test_a_client_that_disconnects_mid_export_releases_its_connection(pg_url, postgres):
    await seeded(pg_url)
    await _fill(pg_url, 30_000)
    database = pg_url.rsplit("/", 1)[1]
    # A small receive buffer: left to autotune (up to 32 MiB here) the client's socket could
    # take the whole export before the test looks, and the server would rightly be done.
    small_buffer = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)])
    with gateways(pg_url, 1, audit_seal_interval_s=0) as (gateway,):
        async with httpx.AsyncClient(timeout=60, transport=small_buffer) as http:
            async with http.stream("GET", f"{gateway.url}/v1/admin/audit/export",
                                   headers=auth_for("carol")) as response:
                assert response.status_code == 200
                # Keep the iterator: a loop left with `break` drops it, and its finaliser closes
                # the response at once, before the test has looked.
                chunks = response.aiter_bytes()
                assert await chunks.__anext__()
                # Mid-stream, the export holds its cursor open in a transaction (the statistics
                # view may show it a moment late on a busy machine).
                deadline = time.monotonic() + 5
                states = await _export_backends(postgres.admin_dsn, database)
                while not any(s in ("idle in transaction", "active") for s in states):
                    assert time.monotonic() < deadline, states
                    await asyncio.sleep(0.05)
                    states = await _export_backends(postgres.admin_dsn, database)
                # and keeps holding it while the client reads nothing: it waits on the client.
                await asyncio.sleep(0.5)
                assert any(s in ("idle in transaction", "active")
                           for s in await _export_backends(postgres.admin_dsn, database))
                await chunks.aclose()
            # The client went away without reading the rest.
            deadline = time.monotonic() + 10
            while any(s in ("idle in transaction", "active")
                      for s in await _export_backends(postgres.admin_dsn, database)):
                assert time.monotonic() < deadline, "the export kept its transaction open after the client left"
                await asyncio.sleep(0.1)
            # And the gateway still serves the audit.
            listed = await http.get(f"{gateway.url}/v1/admin/audit", params={"limit": 1}, headers=auth_for("carol"))
            assert listed.status_code == 200
