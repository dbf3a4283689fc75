"""Real HTTP servers that a test runs on loopback ports, inside its own process: an identity
provider's JWKS, and any ASGI app under uvicorn, in a thread or in the test's event loop.
Every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import uvicorn

STARTUP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A loopback port nothing listens on: a server may take it, a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_socket() -> socket.socket:
    """A listening socket on a free loopback port: its port is known before the server starts."""
    # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so; without it a
    # response written in two parts waits for a delayed ACK (40 ms a request).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app, log_config=None, access_log=False, loop="asyncio", http="h11", **options
    )


class ServerThread:
    """Serves an ASGI app on ``sock`` until ``stop``; the lifespan runs in the server's thread."""

    def __init__(self, app: Any, sock: socket.socket | None = None) -> None:
        self.sock = sock or loopback_socket()
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(_uvicorn_config(app, lifespan="on", timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._run, name=f"server-{self.port}", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self.sock]))

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _QuietServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the test runner owns the signals
        return None


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port in the test's own event loop; yields its base URL."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    server = _QuietServer(_uvicorn_config(app, lifespan="auto", timeout_graceful_shutdown=2))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not server.started and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if not server.started:
            await task  # raises what stopped it
            raise RuntimeError("the server did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=15)
        sock.close()


class JwksServer:
    """Serves ``{"keys": [...]}`` at ``/jwks``; a test rotates keys by changing ``keys``."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.fetches = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.fetches += 1
                body = json.dumps({"keys": server.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/jwks"

    def __enter__(self) -> JwksServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
