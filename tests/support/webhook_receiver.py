"""A webhook receiver on a loopback port, in the test's event loop: it records every request
(headers and body) and answers as the test's behaviour says — including the hostile ways
(never answering, a huge body, a slow drip, a redirect). A raw HTTP/1.1 server, so that
nothing between the gateway and the test smooths those answers over. Every wait is bounded."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

WAIT_S = 20.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


def verify_standard_webhook(secret: str, headers: dict[str, str], body: bytes, *, tolerance_s: int = 300) -> bool:
    """The receiver's side of the Standard Webhooks spec, written from the spec and not from
    the gateway's code: the key is the base64 after ``whsec_``; the signed content is
    ``{webhook-id}.{webhook-timestamp}.{body}``; the header holds space-separated
    ``v1,<base64 HMAC-SHA256>`` signatures, any of which may match; the timestamp must be recent."""
    msg_id, timestamp = headers.get("webhook-id"), headers.get("webhook-timestamp")
    if not msg_id or not timestamp or not timestamp.isdigit():
        return False
    if abs(time.time() - int(timestamp)) > tolerance_s:
        return False
    assert secret.startswith("whsec_")
    key = base64.b64decode(secret[len("whsec_"):])
    to_sign = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, to_sign, hashlib.sha256).digest())
    for candidate in headers.get("webhook-signature", "").split(" "):
        version, _, signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(signature.encode(), expected):
            return True
    return False


Behaviour = Callable[[int, Received], str]
"""Given the request's number (1, 2, ...) and the request: ``ok``, ``fail``, ``hang``,
``huge``, ``drip`` or ``redirect:<url>``."""


@dataclass
class WebhookReceiver:
    behaviour: Behaviour = lambda n, request: "ok"
    requests: list[Received] = field(default_factory=list)
    huge_bytes_sent: int = 0
    _server: asyncio.base_events.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    url: str = ""

    tls: ssl.SSLContext | None = None
    """Serve https with this context (tests.support.tls)."""

    async def start(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}/hook"
        return self

    async def stop(self) -> None:
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5)
        if self._server is not None:
            self._server.close()
            await asyncio.wait_for(self._server.wait_closed(), timeout=5)

    async def __aenter__(self) -> WebhookReceiver:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_for(self, count: int, timeout: float = WAIT_S) -> list[Received]:
        """Until ``count`` requests came in (bounded)."""
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.requests)} of {count} webhook requests arrived in {timeout} s")
            await asyncio.sleep(0.02)
        return self.requests

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            request = Received(method=method, path=path, headers=headers, body=body)
            self.requests.append(request)
            await self._answer(self.behaviour(len(self.requests), request), writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ssl.SSLError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _answer(self, what: str, writer: asyncio.StreamWriter) -> None:
        if what == "ok":
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        elif what == "fail":
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope")
        elif what.startswith("redirect:"):
            location = what.removeprefix("redirect:").encode()
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + location
                         + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif what == "hang":
            await asyncio.sleep(3600)
        elif what == "huge":
            # 2xx and then as much as the client will take, until it hangs up.
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
            chunk = b"x" * 65536
            while self.huge_bytes_sent < 1073741824:
                writer.write(chunk)
                self.huge_bytes_sent += len(chunk)
                await writer.drain()
        elif what == "drip":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while True:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.05)
        await writer.drain()
