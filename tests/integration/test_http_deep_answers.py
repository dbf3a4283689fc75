"""A service's answer is passed to the model as sent when it is JSON that the gateway can read
back; one nested past the gateway's nesting ceiling, one that is not UTF-8, or one holding a
number no float holds is passed as text, so whatever later reads the stored outcome (an
approval's view, the approvals list, a replay) reads it. An error body such a service sends
is never read past the ceiling either."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import msgspec
import pytest

from gateway.app import create_app
from gateway.text import MAX_JSON_DEPTH_CEILING
from tests.integration.http_env import GRANTS, _database, seed_with_grants
from tests.support.app import make_settings
from tests.support.loopback import ServerThread, loopback_socket
from tests.support.tokens import SERVICE_SIGNING_KEY, auth_for

TOOLS_TOML = """
[services.deep]
error_message_field = "detail"

[[tools]]
name = "place"
description = "Place something; the service answers with a deeply nested document."
service = "deep"
permission = "orders:write"
mutates = true
request = { method = "POST", path = "/place", body = ["depth"] }
arguments = { type = "object", required = ["depth"], properties = { depth = { type = "integer", minimum = 1 } } }

[[tools]]
name = "answer"
description = "Place something; the service answers with one of a few odd bodies."
service = "deep"
permission = "orders:write"
mutates = true
request = { method = "POST", path = "/answer", body = ["kind"] }
arguments = { type = "object", required = ["kind"], properties = { kind = { type = "string" } } }
"""

ODD_ANSWERS = {
    "huge-number": (200, b'{"amount": 1e400, "id": 7}'),
    "negative-huge-number": (200, b'[-1e999]'),
    "not-utf8": (200, b'{"name": "caf\xe9"}'),
    "deep-conflict": (409, b"[" * 1500 + b"]" * 1500),
    "deep-conflict-object": (409, b'{"detail": ' + b"[" * 1500 + b"]" * 1500 + b"}"),
}
"""What the service answers ``POST /answer`` with, by the ``kind`` asked for."""


class DeepService:
    """Answers ``POST /place`` with ``{"depth": N}`` in the body by N nested arrays, and
    ``POST /answer`` with ``{"kind": K}`` by ``ODD_ANSWERS[K]``."""

    def __init__(self) -> None:
        self.sock = loopback_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._loop = asyncio.new_event_loop()
        self._stopped = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="deep-service", daemon=True)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._serve, sock=self.sock)
        async with server:
            await self._stopped.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)
                asked = msgspec.json.decode(await reader.readexactly(length))
                if "kind" in asked:
                    status, body = ODD_ANSWERS[asked["kind"]]
                else:
                    status, body = 200, b"[" * asked["depth"] + b"]" * asked["depth"]
                writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    def __enter__(self) -> DeepService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module", params=["postgres"])
def gateway_url(request: pytest.FixtureRequest) -> Iterator[str]:
    databases = _database(request)
    database_url = next(databases)
    try:
        asyncio.run(seed_with_grants(database_url, GRANTS))
        tools_file = request.getfixturevalue("tmp_path_factory").mktemp("tools") / "tools.toml"
        tools_file.write_text(TOOLS_TOML)
        with DeepService() as service:
            settings = make_settings(database_url, tools_file=str(tools_file),
                                     service_base_urls=(f"deep={service.url}",),
                                     service_signing_key=SERVICE_SIGNING_KEY)
            with ServerThread(create_app(settings)) as gateway:
                yield gateway.url
    finally:
        databases.close()


@pytest.fixture
async def client(gateway_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=30) as http:
        yield http


async def place(client: httpx.AsyncClient, depth: int) -> dict:
    return await approved(client, "place", {"depth": depth})


async def approved(client: httpx.AsyncClient, tool: str, arguments: dict) -> dict:
    """Ask for the call as bob, approve it as carol: the approval as the approver then reads
    it, the approvals list and bob's replay of the call read it too."""
    run_id = (await client.post("/v1/runs", json={}, headers=auth_for("bob"))).json()["id"]
    batch = {"tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": tool, "arguments": msgspec.json.encode(arguments).decode()}}]}
    asked = await client.post(f"/v1/runs/{run_id}/tool-calls", headers=auth_for("bob"), json=batch)
    assert asked.status_code == 200, asked.text
    approval_id = msgspec.json.decode(asked.json()["messages"][0]["content"])["error"]["approval_id"]
    decided = await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
    assert decided.status_code == 200, decided.text
    read = await client.get(f"/v1/admin/approvals/{approval_id}", headers=auth_for("carol"))
    assert read.status_code == 200, read.text
    listed = await client.get("/v1/admin/approvals", headers=auth_for("carol"))
    assert listed.status_code == 200, listed.text
    assert read.json()["outcome"] == decided.json()["outcome"]
    replayed = await client.post(f"/v1/runs/{run_id}/tool-calls", headers=auth_for("bob"), json=batch)
    assert replayed.status_code == 200, replayed.text
    content = msgspec.json.decode(replayed.json()["messages"][0]["content"])
    outcome = read.json()["outcome"]
    if outcome["ok"]:
        assert content == {"ok": True, "result": outcome["result"]}
    else:
        assert content["error"]["code"] == outcome["code"]
    return read.json()


async def test_an_answer_nested_past_the_ceiling_is_passed_as_text_and_its_approval_reads(client):
    depth = MAX_JSON_DEPTH_CEILING * 4
    outcome = (await place(client, depth))["outcome"]
    assert outcome["ok"] is True
    assert outcome["result"] == "[" * depth + "]" * depth


@pytest.mark.parametrize("kind", ["huge-number", "negative-huge-number", "not-utf8"])
async def test_an_answer_no_reader_could_hold_is_passed_as_text_and_every_view_of_it_reads(client, kind):
    outcome = (await approved(client, "answer", {"kind": kind}))["outcome"]
    assert outcome["code"] == "OK" and outcome["ok"] is True
    assert outcome["result"] == ODD_ANSWERS[kind][1].decode("utf-8", errors="replace")


@pytest.mark.parametrize("kind", ["deep-conflict", "deep-conflict-object"])
async def test_an_error_body_nested_past_the_ceiling_gives_the_codes_own_message(client, kind):
    outcome = (await approved(client, "answer", {"kind": kind}))["outcome"]
    assert outcome["code"] == "CONFLICT" and outcome["ok"] is False
    assert outcome["error"]["retryable"] is False
