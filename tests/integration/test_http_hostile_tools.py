"""HTTP tools through the real gateway against a hostile service: users of two tenants call
it, and neither ever receives the other's bytes, whatever the service writes when.

The gateway and the service are real servers on loopback ports (each in its own thread) on
PostgreSQL; the service is raw asyncio, so it can misbehave below HTTP.
"""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from urllib.parse import unquote

import httpx
import msgspec
import pytest

from gateway.app import create_app
from tests.integration.http_env import GRANTS, _database, seed_with_grants
from tests.support.app import make_settings
from tests.support.calls import batch, new_run, tool_call
from tests.support.loopback import ServerThread, loopback_socket
from tests.support.tokens import SERVICE_SIGNING_KEY, auth_for

TOOLS_TOML = """
[services.hostile]

[[tools]]
name = "lookup"
description = "Look a value up."
service = "hostile"
permission = "orders:read"
request = { method = "GET", path = "/lookup/{value}" }
arguments = { type = "object", required = ["value"], properties = { value = { type = "string", maxLength = 80 } } }

[[tools]]
name = "compressed"
description = "Answers with a compressed body."
service = "hostile"
permission = "orders:read"
max_result_bytes = 16384
request = { method = "GET", path = "/compressed/{encoding}" }
arguments = { type = "object", required = ["encoding"], properties = { encoding = { type = "string" } } }
"""

LATE_S = 0.05
BOMB_SIZE = 100 * 1024 * 1024


def compressed_zeros(size: int, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    chunk = bytes(1024 * 1024)
    return b"".join(compressor.compress(chunk) for _ in range(size // len(chunk))) + compressor.flush()


def answer(body: bytes, *headers: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
            + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body)


class HostileService:
    """Answers ``GET /lookup/<value>`` with ``{"value": <value>}``. For a value of acme's it
    then writes, ``LATE_S`` later and before it reads the next request on that connection, a
    second answer: acme's value again. ``GET /compressed/<encoding>`` answers 100 MB of zeros,
    compressed, with that Content-Encoding (``identity,gzip``: two such headers, gzip last)."""

    def __init__(self) -> None:
        self.sock = loopback_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.bombs = {"gzip": compressed_zeros(BOMB_SIZE, 16 + zlib.MAX_WBITS),
                      "deflate": compressed_zeros(BOMB_SIZE, zlib.MAX_WBITS)}
        self.accepted = 0
        self.late_answers_sent = 0
        self.accept_encodings: list[str] = []
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._stopped = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-service", daemon=True)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._serve, sock=self.sock)
        async with server:
            await self._stopped.wait()
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                encoding = next((line.split(":", 1)[1].strip() for line in head.lower().split("\r\n")
                                 if line.startswith("accept-encoding:")), "")
                with self._lock:
                    self.accept_encodings.append(encoding)
                if path.startswith("/compressed/"):
                    # "identity,gzip": one Content-Encoding header per name, the body the last one's
                    names = unquote(path.removeprefix("/compressed/")).split(",")
                    headers = [b"content-encoding: " + name.encode() for name in names]
                    writer.write(answer(self.bombs[names[-1]], *headers))
                    await writer.drain()
                    continue
                value = unquote(path.removeprefix("/lookup/"))
                body = msgspec.json.encode({"value": value})
                writer.write(answer(body))
                await writer.drain()
                if value.startswith("acme"):
                    await asyncio.sleep(LATE_S)
                    writer.write(answer(body))
                    await writer.drain()
                    with self._lock:
                        self.late_answers_sent += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except asyncio.CancelledError:
            return  # the service is stopping: nothing waits for this task's outcome
        finally:
            self._tasks.discard(task)
            writer.close()

    def __enter__(self) -> HostileService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=10)
        self.sock.close()


@dataclass
class Env:
    gateway_url: str
    service: HostileService


@pytest.fixture(scope="module", params=["postgres"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    databases = _database(request)
    database_url = next(databases)
    try:
        asyncio.run(seed_with_grants(database_url, GRANTS))
        tools_file = request.getfixturevalue("tmp_path_factory").mktemp("tools") / "tools.toml"
        tools_file.write_text(TOOLS_TOML)
        with HostileService() as service:
            settings = make_settings(
                database_url,
                tools_file=str(tools_file),
                service_base_urls=(f"hostile={service.url}",),
                service_signing_key=SERVICE_SIGNING_KEY,
            )
            with ServerThread(create_app(settings)) as gateway:
                yield Env(gateway_url=gateway.url, service=service)
    finally:
        databases.close()


@pytest.fixture
async def client(env: Env) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=env.gateway_url, timeout=30) as http:
        yield http


async def call(client: httpx.AsyncClient, tool: str, arguments: dict[str, str], *, user: str, tenant: str) -> str:
    """The raw ``content`` the model would read for one call in a fresh run."""
    run = await new_run(client, user, tenant)
    response = await client.post(f"/v1/runs/{run}/tool-calls", headers=auth_for(user, tenant),
                                 json=batch(tool_call(tool, arguments)))
    assert response.status_code == 200, response.text
    content: str = response.json()["messages"][0]["content"]
    return content


async def test_globex_never_receives_the_late_answer_the_service_appends_to_acmes(env: Env, client):
    for round_ in range(5):
        acme_value, globex_value = f"acme-secret-{round_}", f"globex-{round_}"
        sent = env.service.late_answers_sent
        acme = await call(client, "lookup", {"value": acme_value}, user="alice", tenant="acme")
        # Right away, while acme's late answer is still to come on acme's connection.
        globex = await call(client, "lookup", {"value": globex_value}, user="alice", tenant="globex")
        assert msgspec.json.decode(acme) == {"ok": True, "result": {"value": acme_value}}
        assert msgspec.json.decode(globex) == {"ok": True, "result": {"value": globex_value}}
        assert "acme" not in globex
        # Bytes that arrive after a connection was found clean cannot be told from the next
        # answer on it; that connection serves only acme's alice, and the next round checks
        # the pool closes it once they are there (no round may race its own late answer).
        async with asyncio.timeout(10):
            while env.service.late_answers_sent == sent:
                await asyncio.sleep(0.01)


async def test_late_bytes_on_an_idle_connection_never_answer_the_same_users_next_call(env: Env, client):
    first = await call(client, "lookup", {"value": "acme-first"}, user="bob", tenant="acme")
    sent = env.service.late_answers_sent
    assert msgspec.json.decode(first)["result"] == {"value": "acme-first"}
    async with asyncio.timeout(10):
        while env.service.late_answers_sent == sent:  # until the late answer is on the wire
            await asyncio.sleep(0.01)
    second = await call(client, "lookup", {"value": "acme-second"}, user="bob", tenant="acme")
    assert msgspec.json.decode(second)["result"] == {"value": "acme-second"}


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "identity,gzip"])
async def test_a_compressed_answer_fails_that_call_only_without_being_inflated(env: Env, client, encoding: str):
    """``identity,gzip``: a second Content-Encoding header does not hide behind a first that says identity."""
    tracemalloc.start()
    try:
        bomb, globex = await asyncio.gather(
            call(client, "compressed", {"encoding": encoding}, user="alice", tenant="acme"),
            call(client, "lookup", {"value": "globex-meanwhile"}, user="alice", tenant="globex"),
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = msgspec.json.decode(bomb)["error"]
    assert (error["code"], error["retryable"]) == ("TOOL_EXECUTION_FAILED", False)
    assert error["message"] == "The service answered in a way this tool does not expect."
    assert msgspec.json.decode(globex) == {"ok": True, "result": {"value": "globex-meanwhile"}}
    # 100 MB inflated would show here; refused on its header, the call allocates a few MB at most.
    assert peak < 16 * 1024 * 1024, peak
    assert set(env.service.accept_encodings) == {"identity"}
