"""The transport HTTP tools reach services through: keep-alive reuse, its limits, and
connections the server closed, against a real HTTP/1.1 server on a loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpcore
import httpx
import pytest

from gateway.tools.http_transport import ServiceCall, pool_of, service_transport


class CountingServer:
    """A minimal HTTP/1.1 keep-alive server that counts the connections it accepts and can
    close idle ones, or hold a response until released."""

    def __init__(self) -> None:
        self.accepted = 0
        self.open: set[asyncio.StreamWriter] = set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        self.release.set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    return
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                await self.release.wait()
                self.in_flight -= 1
                body = b'{"ok":true}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.open.discard(writer)
            writer.close()

    async def close_idle_connections(self) -> None:
        for writer in list(self.open):
            writer.close()
        await asyncio.sleep(0.05)  # let the client's loop read the FINs

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.open):
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[CountingServer, str]]:
    counting = CountingServer()
    port = await counting.start()
    yield counting, f"http://127.0.0.1:{port}"
    await counting.stop()


def client(max_connections: int = 10, max_keepalive: int = 10) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive)
    return httpx.AsyncClient(transport=service_transport(limits=limits), timeout=5)


async def test_sequential_requests_reuse_one_kept_alive_connection(server):
    counting, base = server
    async with client() as http:
        for _ in range(5):
            response = await http.get(f"{base}/x")
            assert response.json() == {"ok": True}
    assert counting.accepted == 1


async def test_concurrent_requests_never_exceed_max_connections(server):
    counting, base = server
    counting.release.clear()
    async with client(max_connections=3) as http:
        requests = [asyncio.create_task(http.get(f"{base}/x")) for _ in range(9)]
        await asyncio.sleep(0.2)
        assert counting.most_in_flight == 3
        counting.release.set()
        responses = await asyncio.gather(*requests)
    assert all(r.status_code == 200 for r in responses)
    assert counting.accepted == 3


async def test_a_connection_the_server_closed_is_not_reused(server):
    counting, base = server
    async with client() as http:
        assert (await http.get(f"{base}/x")).status_code == 200
        await counting.close_idle_connections()
        assert (await http.get(f"{base}/x")).status_code == 200
    assert counting.accepted == 2


async def test_only_max_keepalive_idle_connections_are_kept(server):
    counting, base = server
    counting.release.clear()
    async with client(max_connections=4, max_keepalive=1) as http:
        requests = [asyncio.create_task(http.get(f"{base}/x")) for _ in range(4)]
        await asyncio.sleep(0.2)
        counting.release.set()
        await asyncio.gather(*requests)
        await asyncio.sleep(0.05)
        assert len(counting.open) == 1
        assert (await http.get(f"{base}/x")).status_code == 200
    assert counting.accepted == 4


async def test_a_refused_connection_is_a_connect_error_and_frees_its_slot(server):
    _, base = server
    closed = httpx.URL(base).copy_with(port=1)
    async with client(max_connections=1) as http:
        for _ in range(3):
            with pytest.raises(httpx.ConnectError):
                await http.get(str(closed))
        assert (await http.get(f"{base}/x")).status_code == 200


async def test_a_call_that_finds_every_connection_busy_waits_its_pool_timeout_then_gives_up(server):
    counting, base = server
    counting.release.clear()
    pool = pool_of(service_transport(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)))
    first = asyncio.create_task(pool.exchange(tool_call(base, pool_timeout=5.0)))
    await asyncio.sleep(0.1)
    with pytest.raises(httpcore.PoolTimeout):
        await pool.exchange(tool_call(base, pool_timeout=0.2))
    waiting = asyncio.create_task(pool.exchange(tool_call(base, pool_timeout=5.0)))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # queued behind the first, in order
    counting.release.set()
    assert (await first).status == 200 and (await waiting).status == 200
    assert counting.most_in_flight == 1
    await pool.aclose()


def tool_call(base: str, *, pool_timeout: float) -> ServiceCall:
    url = httpx.URL(f"{base}/x")
    return ServiceCall(
        scheme=b"http", host=url.host.encode(), port=url.port or 80, target=b"/x", method=b"GET",
        headers=[(b"host", url.netloc)], body=None, partition=None,
        timeouts={"connect": 5.0, "read": 5.0, "write": 5.0, "pool": pool_timeout}, limit=1024, error_limit=1024,
    )
