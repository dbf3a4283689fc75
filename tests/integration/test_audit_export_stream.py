"""The audit export streams: memory stays flat over 100 000 rows; a slow reader holds no
database session while the gateway waits on it; exports over a cap are 429; a stream that
fails mid-way says so in its last line. Measured on real gateway processes."""

from __future__ import annotations

import asyncio
import csv
import io
import json
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
SELECT $2, 'tool_call', 'u' || (i % 100), 'run_' || (i % 1000), 'call_' || i, 'search_articles',
       jsonb_build_object('query', repeat('expense policy ', 12), 'limit', i % 50),
       md5(i::text) || md5((i + 1)::text), 'OK', 1.5, 'req_' || md5(i::text),
       jsonb_build_object('note', repeat('x', 60)), now() - (i || ' milliseconds')::interval
  FROM generate_series(1, $1) AS i
"""


def _dsn(pg_url: str) -> str:
    return pg_url.replace("postgresql+asyncpg://", "postgresql://")


async def _fill(pg_url: str, rows: int, tenant: str = "acme") -> None:
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        await conn.execute(FILL, rows, tenant)
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


EXPORT = "/v1/admin/audit/export"


def _small_buffer() -> httpx.AsyncHTTPTransport:
    # Left to autotune (up to 32 MiB here) a client's socket could take a whole export before
    # the test looks, and the server would rightly be done with it.
    return httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)])


class SlowReader:
    """An export whose client read one chunk and then stopped reading."""

    def __init__(self, base: str, tenant: str = "acme", **params: str) -> None:
        self._http = httpx.AsyncClient(timeout=60, transport=_small_buffer())
        self._request = self._http.build_request("GET", base + EXPORT, params=params, headers=auth_for("carol", tenant))
        self.response: httpx.Response | None = None

    async def start(self) -> httpx.Response:
        self.response = await self._http.send(self._request, stream=True)
        if self.response.status_code == 200:
            # Keep the iterator: a loop left with `break` drops it, and its finaliser closes the
            # response at once.
            self.chunks = self.response.aiter_bytes()
            self.first = await self.chunks.__anext__()
        return self.response

    async def rest(self) -> bytes:
        return self.first + b"".join([chunk async for chunk in self.chunks])

    async def close(self) -> None:
        if self.response is not None:
            await self.response.aclose()
        await self._http.aclose()


async def _gateway_sessions_in_transaction(admin_dsn: str, database: str) -> list[str]:
    conn = await asyncpg.connect(admin_dsn)
    try:
        rows = await conn.fetch(
            "SELECT state, query FROM pg_stat_activity WHERE datname = $1 AND application_name = 'gateway' "
            "AND state LIKE 'idle in transaction%'",
            database,
        )
    finally:
        await conn.close()
    return [f"{row['state']}: {row['query']}" for row in rows]


async def test_slow_readers_hold_no_session_in_a_transaction_and_other_tenants_are_served(pg_url, postgres):
    await seeded(pg_url)
    await _fill(pg_url, 30_000)
    database = pg_url.rsplit("/", 1)[1]
    readers = 10  # as many as the pool has connections
    with gateways(pg_url, 1, audit_seal_interval_s=0, database_pool_size=readers,
                  audit_export_max_per_tenant=readers, audit_export_max_per_process=readers) as (gateway,):
        slow = [SlowReader(gateway.url) for _ in range(readers)]
        try:
            for reader in slow:
                assert (await reader.start()).status_code == 200
            # Every reader is stalled; the gateway waits on each with no transaction open. (A
            # page being read at the moment of a look may show one for an instant: look until
            # several looks in a row find none.)
            clean, deadline = 0, time.monotonic() + 20
            while clean < 3:
                held = await _gateway_sessions_in_transaction(postgres.admin_dsn, database)
                clean = 0 if held else clean + 1
                assert time.monotonic() < deadline, held
                await asyncio.sleep(0.1)

            # Another tenant's tool call is served meanwhile.
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
                run = await http.post("/v1/runs", json={}, headers=auth_for("alice", "globex"))
                assert run.status_code == 201, run.text
                called = await http.post(
                    f"/v1/runs/{run.json()['id']}/tool-calls", headers=auth_for("alice", "globex"),
                    json={"tool_calls": [{"id": "c1", "type": "function",
                                          "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
                )
                assert called.status_code == 200, called.text
                assert json.loads(called.json()["messages"][0]["content"])["result"] == 5
            assert all(reader.response is not None and not reader.response.is_closed for reader in slow)
        finally:
            for reader in slow:
                await reader.close()


async def test_exports_over_the_tenants_or_the_processs_cap_are_429_with_retry_after(pg_url):
    await seeded(pg_url)
    await _fill(pg_url, 30_000, "acme")
    await _fill(pg_url, 30_000, "globex")
    with gateways(pg_url, 1, audit_seal_interval_s=0,
                  audit_export_max_per_tenant=2, audit_export_max_per_process=3) as (gateway,):
        held = [SlowReader(gateway.url), SlowReader(gateway.url), SlowReader(gateway.url, "globex")]
        extra = [SlowReader(gateway.url), SlowReader(gateway.url, "globex")]
        try:
            for reader in held:
                assert (await reader.start()).status_code == 200
            # acme has its two; globex is under its own cap, but the process has its three.
            for reader in extra:
                refused = await reader.start()
                assert refused.status_code == 429
                assert refused.headers["retry-after"] == "5"
                await refused.aread()
                assert refused.json()["error"]["code"] == "RATE_LIMITED"

            # A client that goes away gives its export back.
            await held[0].close()
            again = SlowReader(gateway.url, format="csv")
            deadline = time.monotonic() + 20
            while (await again.start()).status_code != 200:
                await again.close()
                assert time.monotonic() < deadline, "the closed export kept its slot"
                await asyncio.sleep(0.1)
                again = SlowReader(gateway.url, format="csv")
            held.append(again)
        finally:
            for reader in held + extra:
                await reader.close()


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
async def test_a_stream_that_fails_midway_ends_with_an_error_line_logged_with_its_stack(pg_url, fmt):
    await seeded(pg_url)
    await _fill(pg_url, 30_000)
    with gateways(pg_url, 1, audit_seal_interval_s=0, database_statement_timeout_s=1) as (gateway,):
        reader = SlowReader(gateway.url, format=fmt)
        locker = await asyncpg.connect(_dsn(pg_url))
        try:
            assert (await reader.start()).status_code == 200
            # Mid-stream, the table becomes unreadable: the next page's read times out.
            locking = locker.transaction()
            await locking.start()
            await locker.execute("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE")
            body = await reader.rest()
            await locking.rollback()
        finally:
            await reader.close()
            await locker.close()
        events = gateway.log_events()
    lines = body.decode().splitlines()
    assert 1 < len(lines) < 30_000
    if fmt == "jsonl":
        last = json.loads(lines[-1])
        assert set(last) == {"error"}
        code, error_id = last["error"]["code"], last["error"]["error_id"]
        assert all("id" in json.loads(line) for line in lines[:-1])
    else:
        [last] = list(csv.reader(io.StringIO(lines[-1])))
        assert last[0] == "#error"
        code, error_id = last[1], last[2]
        assert all(row[0].isdigit() for row in csv.reader(io.StringIO("\n".join(lines[1:-1]))))
    assert code == "INTERNAL_ERROR"
    [logged] = [e for e in events if e.get("event") == "audit_export_failed"]
    assert logged["error_id"] == error_id and logged["level"] == "error"
    assert "Traceback" in logged["exception"] and "QueryCanceled" in logged["exception"]


async def _slot_is_free(base: str) -> bool:
    """Whether acme can start an export now (the one it starts is closed at once)."""
    probe = SlowReader(base)
    try:
        return (await probe.start()).status_code == 200
    finally:
        await probe.close()


async def test_an_export_whose_client_takes_nothing_is_cut_short_and_gives_its_slot_back(pg_url):
    await seeded(pg_url)
    await _fill(pg_url, 30_000)
    with gateways(pg_url, 1, audit_seal_interval_s=0, audit_export_max_per_tenant=1,
                  stream_stall_timeout_s=0.5) as (gateway,):
        stalled = SlowReader(gateway.url)
        try:
            assert (await stalled.start()).status_code == 200
            deadline = time.monotonic() + 20
            while not await _slot_is_free(gateway.url):
                assert time.monotonic() < deadline, "the stalled export kept its slot"
                await asyncio.sleep(0.1)
            # What the client had not taken is gone: the body ends without its last chunk, so
            # the client knows it is incomplete.
            with pytest.raises(httpx.RemoteProtocolError):
                await stalled.rest()
        finally:
            await stalled.close()
        events = gateway.log_events()
    [logged] = [e for e in events if e.get("event") == "stream_client_stalled"]
    assert logged["stream"] == "audit_export" and logged["tenant"] == "acme" and logged["level"] == "warning"
    assert 0 < logged["sent_bytes"] < 30_000 * 400
    # The connection was closed for it: uvicorn saw the client gone and logged no error.
    assert not [e for e in events if e.get("level") == "error"], [e for e in events if e.get("level") == "error"]


async def test_an_export_whose_client_keeps_reading_slowly_is_never_cut(pg_url):
    await seeded(pg_url)
    await _fill(pg_url, 40_000)
    with gateways(pg_url, 1, audit_seal_interval_s=0, audit_export_max_per_tenant=1,
                  stream_stall_timeout_s=1) as (gateway,):
        async with httpx.AsyncClient(timeout=60, transport=_small_buffer()) as http:
            request = http.build_request("GET", gateway.url + EXPORT, headers=auth_for("carol"))
            response = await http.send(request, stream=True)
            assert response.status_code == 200
            started, checked, size = time.monotonic(), False, 0
            async for chunk in response.aiter_raw():
                size += len(chunk)
                await asyncio.sleep(len(chunk) / 4_000_000)  # about 4 MB/s, ~4 s for the whole
                if not checked and time.monotonic() - started > 2:
                    # Two deadlines in, the export is still streaming (its slot still held),
                    # more than the socket buffers hold still to come.
                    assert not await _slot_is_free(gateway.url)
                    checked = True
            await response.aclose()
        events = gateway.log_events()
    assert checked
    assert size > 16 * 2**20
    assert not [e for e in events if e.get("event") == "stream_client_stalled"]
