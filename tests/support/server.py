"""Real `gateway serve` processes on loopback ports, for scale-out and shutdown tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.tokens import TEST_SECRET

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON events the process logged (non-JSON lines, if any, are skipped)."""
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return events

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise


def gateway_env(database_url: str, **settings: Any) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GATEWAY_", "PROMETHEUS_"))}
    env.update(
        {
            "GATEWAY_DATABASE_URL": database_url,
            "GATEWAY_JWT_SECRET": TEST_SECRET,
            "GATEWAY_JWT_LEEWAY_S": "0",
            "GATEWAY_LOG_LEVEL": "INFO",
            "GATEWAY_LOG_FORMAT": "json",
        }
    )
    env.update({f"GATEWAY_{name.upper()}": str(value) for name, value in settings.items()})
    return env


def start_gateway(
    env: dict[str, str], log_path: Path, *args: str, cwd: Path | None = None
) -> GatewayProcess:
    """``python -m gateway serve`` on a free loopback port; stderr and stdout go to ``log_path``."""
    port = free_port()
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd or ROOT,
    )
    log.close()
    return GatewayProcess(process=process, port=port, log_path=log_path)


def wait_until_ready(*gateways: GatewayProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for gateway in gateways:
        while True:
            if gateway.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {gateway.process.returncode}:\n{gateway.log_path.read_text()}")
            try:
                if httpx.get(gateway.url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway on {gateway.url} not ready:\n{gateway.log_path.read_text()}")
            time.sleep(0.2)
