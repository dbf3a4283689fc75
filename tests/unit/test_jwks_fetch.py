"""What a JWKS fetch reads from the identity provider: an uncompressed body, at most
``MAX_JWKS_BYTES`` of it, within the fetch's timeout however slowly it comes. A fetch that
fails keeps the keys already known; a token whose key is unknown is refused."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from gateway.auth.jwks import MAX_JWKS_BYTES, JwksCache, JwksKeyNotFound
from gateway.tools.http_transport import service_transport
from tests.support.keys import public_jwk, rsa_key

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]
KEY = rsa_key()


def keyset(*kids: str) -> bytes:
    return json.dumps({"keys": [public_jwk(kid, KEY, "RS256") for kid in kids]}).encode()


def response(body: bytes, *headers: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
            + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body)


class Provider:
    """An identity provider on a loopback port that answers each fetch with ``answer``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.accept_encodings: list[bytes] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/jwks"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.accept_encodings += [line.split(b":", 1)[1].strip() for line in head.lower().split(b"\r\n")
                                          if line.startswith(b"accept-encoding:")]
                await self.answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except asyncio.CancelledError:
            return  # stopped by the test
        finally:
            self._tasks.discard(task)
            writer.close()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks)


@pytest.fixture
async def provider() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[Provider, JwksCache]]]]:
    started: list[Provider] = []
    limits = httpx.Limits(max_connections=10, max_keepalive_connections=10)
    async with httpx.AsyncClient(transport=service_transport(limits=limits), timeout=5) as http:

        async def start(answer: Answer) -> tuple[Provider, JwksCache]:
            serving = Provider(answer)
            started.append(serving)
            return serving, JwksCache(await serving.start(), http, cache_s=300, timeout_s=0.5)

        yield start
        for serving in started:
            await serving.stop()


async def test_a_plain_keyset_is_fetched_asking_for_identity(provider):
    async def plain(writer: asyncio.StreamWriter) -> None:
        writer.write(response(keyset("k1")))

    serving, cache = await provider(plain)
    assert (await cache.key_for("k1")).key_id == "k1"
    assert serving.accept_encodings == [b"identity"]


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
async def test_a_compressed_keyset_is_refused_without_being_inflated(provider, encoding: bytes):
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS)
    # A valid keyset followed by 100 MB of spaces, which JSON would allow.
    bomb = compressor.compress(keyset("k1")[:-1]) + b"".join(
        compressor.compress(b" " * (1024 * 1024)) for _ in range(100)) + compressor.compress(b"}") + compressor.flush()

    async def compressed(writer: asyncio.StreamWriter) -> None:
        writer.write(response(bomb, b"content-encoding: " + encoding))

    _, cache = await provider(compressed)
    tracemalloc.start()
    try:
        with pytest.raises(JwksKeyNotFound):
            await cache.key_for("k1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak


async def test_a_keyset_larger_than_the_cap_is_refused(provider):
    async def oversized(writer: asyncio.StreamWriter) -> None:
        body = keyset("k1")
        writer.write(response(body[:-1] + b" " * MAX_JWKS_BYTES + b"}"))

    _, cache = await provider(oversized)
    with pytest.raises(JwksKeyNotFound):
        await cache.key_for("k1")


async def test_a_keyset_sent_byte_by_byte_ends_at_the_fetch_timeout(provider):
    """Each byte comes well within the read timeout; the fetch as a whole does not."""

    async def trickle(writer: asyncio.StreamWriter) -> None:
        body = keyset("k1")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    _, cache = await provider(trickle)
    async with asyncio.timeout(30):  # a guard against a hang, far above the 0.5 s fetch timeout
        with pytest.raises(JwksKeyNotFound):
            await cache.key_for("k1")


@pytest.mark.parametrize("odd_kid", [["k0"], {"k": 0}], ids=["list", "object"])
async def test_a_key_whose_kid_is_not_a_string_is_skipped_and_the_others_still_serve(provider, odd_kid):
    async def odd(writer: asyncio.StreamWriter) -> None:
        keys = json.loads(keyset("k1"))
        keys["keys"].insert(0, {**public_jwk("k0", KEY, "RS256"), "kid": odd_kid})
        writer.write(response(json.dumps(keys).encode()))

    _, cache = await provider(odd)
    assert (await cache.key_for("k1")).key_id == "k1"
    with pytest.raises(JwksKeyNotFound):
        await cache.key_for(str(odd_kid))
