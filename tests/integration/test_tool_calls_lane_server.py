"""The tool-calls route's fast lane on a real `gateway serve` process, where bodies arrive in
pieces and clients go away: a cached caller's requests are the lane's (the policy cache is
on, as by default), and each hostile body is answered as the framework answers it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa

from tests.support import db
from tests.support.app import seeded
from tests.support.calls import batch, contents, tool_call
from tests.support.http import assert_error
from tests.support.processes import gateways
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres

ALICE = {**auth_for("alice"), "content-type": "application/json"}
LIMIT = 4096


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
        await asyncio.sleep(0.01)


async def test_bodies_in_pieces_and_clients_that_leave(pg_url):
    await seeded(pg_url)
    with gateways(pg_url, 1, log_level="INFO", max_body_bytes=LIMIT, policy_cache_s=60, audit_seal_interval_s=0) as (gateway,):
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            run = (await http.post("/v1/runs", headers=ALICE)).json()["id"]  # the caller is cached from here
            path = f"/v1/runs/{run}/tool-calls"
            call = json.dumps(batch(tool_call("add", {"a": 2, "b": 3}, call_id="c1"))).encode()

            # chunked, no length declared: read to its end
            whole = await http.post(path, content=pieces(call[:10], call[10:40], call[40:]), headers=ALICE)
            assert whole.status_code == 200, whole.text
            assert contents(whole.json())[0]["result"] == 5

            # chunked past the limit: 413, nothing ran
            over = await http.post(
                path,
                content=pieces(b'{"tool_calls": [{"id": "c2", "type": "function", "function": '
                               b'{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}}], "pad": "',
                               *[b"x" * 1024] * 5, b'"}'),
                headers=ALICE,
            )
            assert_error(over, 413, "PAYLOAD_TOO_LARGE")

            # a length over the limit: 413 before the body is read
            declared = await http.post(path, content=b"x" * (LIMIT + 1), headers=ALICE)
            assert_error(declared, 413, "PAYLOAD_TOO_LARGE")

            # a client that leaves mid-body: nothing runs, nothing breaks
            reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {ALICE['Authorization']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            ).encode()
            writer.write(head + b'{"tool_calls": [{"id": "c3", ')
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(0.2)

            after = await http.post(path, content=json.dumps(batch(tool_call("add", {"a": 1, "b": 1}, call_id="c4"))),
                                    headers=ALICE)
            assert after.status_code == 200, after.text
        events = gateway.log_events()
    audited = await db.audit_rows(pg_url, run_id=run, kind="tool_call")
    assert [row.tool_call_id for row in audited] == ["c1", "c4"]
    assert not [event for event in events if event.get("level") == "error"], events
    assert any(event.get("event") == "client_disconnected" for event in events)
    rows = await db.rows(pg_url, sa.text("SELECT tool_call_id FROM tool_calls WHERE run_id = :run ORDER BY 1")
                         .bindparams(run=run))
    assert [row.tool_call_id for row in rows] == ["c1", "c4"]
