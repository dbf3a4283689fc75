"""An MCP server (streamable HTTP, written by hand on raw asyncio) on a loopback port, in a
thread, that turns hostile when a test says so.

Ordinarily it answers like any server: ``echo`` returns its text, ``wait`` answers after ``ms``
milliseconds. With ``mode = "forget_then_hang"`` it answers a ``tools/call`` with 404 (it forgot
the session), an ``initialize`` with the head of an event stream and a session id and then only
SSE comments, forever, and the DELETE that ends a session one byte every ``drip_s`` seconds: no
HTTP client's read timeout ever fires against it. With ``mode = "retry_zero"`` it answers a
``tools/call``, and every ``GET``, with an event stream holding only an event id and ``retry: 0``,
then ends it: a client that reconnects as told does so at once, for ever. With ``mode =
"slow_echo"``, ``echo`` answers after a minute; with ``mode = "compressed_echo"``, its answer
says it is gzip-compressed."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from typing import Any

STARTUP_TIMEOUT_S = 15.0

TOOLS = [
    {"name": "echo", "description": "Returns its text.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                     "additionalProperties": False}},
    {"name": "wait", "description": "Answers after `ms` milliseconds.",
     "inputSchema": {"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"],
                     "additionalProperties": False}},
    {"name": "shape", "description": "Answers structured content its own output schema refuses.",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
     "outputSchema": {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]}},
    {"name": "redos", "description": "Answers a string its output schema's pattern takes hours to refuse by backtracking.",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
     "outputSchema": {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}}}},
    {"name": "forget", "description": "Answered 404: the server forgot the session (behind a balancer, say).",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False}},
    {"name": "huge", "description": "Answers structured content holding 1e400, with its text or without.",
     "inputSchema": {"type": "object", "properties": {"with_text": {"type": "boolean"}}, "required": ["with_text"],
                     "additionalProperties": False}},
]
HUGE = '{"amount": 1e400, "id": 7}'
"""Valid JSON that no float holds: a parser reads infinity, an encoder writes null."""


def _json_response(message: dict[str, Any], *, session_id: str | None = None) -> bytes:
    return _json_response_text(json.dumps(message), session_id=session_id)


def _json_response_text(text: str, *, session_id: str | None = None) -> bytes:
    body = text.encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
    if session_id is not None:
        head += b"\r\nmcp-session-id: " + session_id.encode()
    return head + b"\r\n\r\n" + body


def _retry_zero() -> bytes:
    """An event stream with an event id and ``retry: 0``, and nothing else: it ends at once."""
    body = b"id: 1\nretry: 0\n\n"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


def _empty(status: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n"


class HostileMcp:
    def __init__(self, *, drip_s: float = 2.0) -> None:
        self.mode = "normal"
        self.drip_s = drip_s
        self.seen: list[str] = []
        """``DELETE`` or the JSON-RPC method of each request, in order."""
        self.dripping = 0
        """Calls being answered with an endless event stream (mode ``drip_calls``) right now."""
        self.authorizations: list[tuple[str, str]] = []
        """The JSON-RPC method and the ``authorization`` header of each request with an id."""
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> HostileMcp:
        started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve(started)), daemon=True)
        self._thread.start()
        if not started.wait(STARTUP_TIMEOUT_S):
            raise RuntimeError("the hostile MCP server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stopped is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=15)

    async def _serve(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        async with server:
            await self._stopped.wait()
        # asyncio.run cancels the connections still open (a drip, an endless stream).

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                method = lines[0].split(b" ")[0]
                length, authorization = 0, ""
                for line in lines[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                    if line.lower().startswith(b"authorization:"):
                        authorization = line.split(b":", 1)[1].strip().decode()
                body = await reader.readexactly(length) if length else b""
                message = json.loads(body) if body else {}
                if method == b"GET":
                    resuming = any(line.lower().startswith(b"last-event-id:") for line in lines[1:])
                    self.seen.append("GET resume" if resuming else "GET")
                if "id" in message:
                    self.authorizations.append((str(message.get("method")), authorization))
                await self._answer(method, message, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # The server stops (it cancels the connections still held): Python 3.11's stream
            # callback would log a connection task that ends cancelled as an error.
            pass
        finally:
            writer.close()

    async def _answer(self, method: bytes, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        hostile = self.mode == "forget_then_hang"
        if method == b"DELETE":
            self.seen.append("DELETE")
            if hostile:
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(self.drip_s)
            writer.write(_empty(b"200 OK"))
        elif method == b"GET" and self.mode == "retry_zero":
            writer.write(_retry_zero())
        elif method != b"POST":
            writer.write(_empty(b"405 Method Not Allowed"))
        elif "id" not in message:
            self.seen.append(str(message.get("method")))
            writer.write(_empty(b"202 Accepted"))
        else:
            rpc = str(message.get("method"))
            self.seen.append(rpc)
            writer.write(await self._result(rpc, message, writer, hostile))
        await writer.drain()

    async def _result(self, rpc: str, message: dict[str, Any], writer: asyncio.StreamWriter, hostile: bool) -> bytes:
        params = message.get("params") or {}
        reply = {"jsonrpc": "2.0", "id": message["id"]}
        if rpc == "initialize":
            session_id = uuid.uuid4().hex
            if hostile:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nmcp-session-id: "
                             + session_id.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
                while True:
                    writer.write(b"4\r\n: x\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.2)
            return _json_response({**reply, "result": {
                "protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"}}}, session_id=session_id)
        if rpc == "tools/list":
            return _json_response({**reply, "result": {"tools": TOOLS}})
        if rpc == "tools/call":
            if hostile:
                return _empty(b"404 Not Found")
            if self.mode == "retry_zero":
                return _retry_zero()
            if self.mode == "slow_echo" and params.get("name") == "echo":
                await asyncio.sleep(60)
            if self.mode == "compressed_echo" and params.get("name") == "echo":
                body = json.dumps({**reply, "result": {"content": [{"type": "text", "text": "x"}]}}).encode()
                return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            if self.mode == "drip_calls":
                # An event stream that never answers: a comment every 0.2 s, until the client goes.
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                self.dripping += 1
                try:
                    while True:
                        writer.write(b"4\r\n: x\n\r\n")
                        await writer.drain()
                        await asyncio.sleep(0.2)
                finally:
                    self.dripping -= 1
            arguments = params.get("arguments") or {}
            if params.get("name") == "huge":
                content = [{"type": "text", "text": HUGE}] if arguments.get("with_text") else []
                body = json.dumps({**reply, "result": {"content": content, "structuredContent": "__HUGE__"}})
                return _json_response_text(body.replace('"__HUGE__"', HUGE))
            if params.get("name") == "forget":
                return _empty(b"404 Not Found")
            if params.get("name") == "redos":
                return _json_response({**reply, "result": {"content": [{"type": "text", "text": "r"}],
                                                           "structuredContent": {"v": "a" * 20 + "!"}}})
            if params.get("name") == "shape":
                return _json_response({**reply, "result": {"content": [{"type": "text", "text": "1"}],
                                                           "structuredContent": {"v": 1}}})
            if params.get("name") == "wait":
                await asyncio.sleep(arguments["ms"] / 1000)
                text = "waited"
            else:
                text = str(arguments.get("text"))
            return _json_response({**reply, "result": {"content": [{"type": "text", "text": text}]}})
        return _json_response({**reply, "error": {"code": -32601, "message": "no such method"}})
