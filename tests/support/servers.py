"""Real gateway processes on loopback ports, for claims about several processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.tokens import TEST_SECRET

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gateway_env(database_url: str, **settings: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        GATEWAY_DATABASE_URL=database_url,
        GATEWAY_JWT_SECRET=TEST_SECRET,
        GATEWAY_JWT_LEEWAY_S="0",
        GATEWAY_LOG_LEVEL="WARNING",
    )
    for name, value in settings.items():
        env[f"GATEWAY_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    base_url: str

    @property
    def pid(self) -> int:
        return self.process.pid


def start_gateway(database_url: str, **settings: object) -> GatewayProcess:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=gateway_env(database_url, **settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with {process.returncode} before serving")
        try:
            if httpx.get(base_url + "/healthz", timeout=1.0).status_code == 200:
                return GatewayProcess(process, base_url)
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the gateway did not start serving within 30 s")
        time.sleep(0.1)


def stop_gateway(gateway: GatewayProcess) -> None:
    gateway.process.terminate()
    try:
        gateway.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        gateway.process.kill()
        gateway.process.wait(timeout=5)


@contextmanager
def gateways(database_url: str, count: int, **settings: object) -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    try:
        for _ in range(count):
            started.append(start_gateway(database_url, **settings))
        yield started
    finally:
        for gateway in started:
            stop_gateway(gateway)


def run_cli(database_url: str, *args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        env=gateway_env(database_url, **settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
