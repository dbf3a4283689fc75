"""Real HTTP servers on loopback ports for tests: uvicorn in a thread with its own event loop."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn


def loopback_socket() -> socket.socket:
    """A listening socket on a free loopback port: its port is known before the server starts."""
    # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so; without it a
    # response written in two parts waits for a delayed ACK (40 ms a request).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


class ServerThread:
    """Serves an ASGI app on ``sock`` until ``stop``; the lifespan runs in the server's thread."""

    def __init__(self, app: Any, sock: socket.socket | None = None) -> None:
        self.sock = sock or loopback_socket()
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, lifespan="on", log_config=None, access_log=False, loop="asyncio", http="h11",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"server-{self.port}", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self.sock]))

    def start(self, timeout: float = 15.0) -> ServerThread:
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
