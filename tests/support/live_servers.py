"""Real servers on loopback ports: an identity provider's JWKS, the gateway under uvicorn in a
thread, and whole `gateway serve` processes. Every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from litestar import Litestar

from tests.support.tokens import TEST_SECRET

STARTUP_TIMEOUT_S = 30.0


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_in_thread(app: Litestar) -> Iterator[str]:
    """The app under a real uvicorn server on a loopback port, in a thread with its own event loop."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start under uvicorn")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@contextmanager
def gateway_processes(database_url: str, count: int, **env: str) -> Iterator[list[str]]:
    """``count`` `gateway serve` processes on free loopback ports, sharing one database."""
    environ = {
        **os.environ,
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_JWT_SECRET": TEST_SECRET,
        "GATEWAY_JWT_LEEWAY_S": "0",
        "GATEWAY_POLICY_CACHE_S": "0",
        "GATEWAY_LOG_LEVEL": "WARNING",
        **env,
    }
    logs = Path(tempfile.mkdtemp(prefix="gateway-procs-"))
    processes: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    try:
        for index in range(count):
            port = free_port()
            log_path = logs / f"gateway-{index}.log"
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)],
                    env=environ, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )
            processes.append((process, f"http://127.0.0.1:{port}", log_path))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for process, url, log_path in processes:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"gateway process exited early:\n{log_path.read_text()[-3000:]}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway process did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.1)
        yield [url for _, url, _ in processes]
    finally:
        for process, _, _ in processes:
            process.terminate()
        for process, _, _ in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        for path in logs.iterdir():
            path.unlink()
        logs.rmdir()
