"""Real `gateway` processes that a test starts: servers on loopback ports, and CLI commands.
Each server logs JSON events to a file of its own; every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.loopback import free_port
from tests.support.tokens import TEST_SECRET

ROOT = Path(__file__).resolve().parents[2]


def gateway_env(database_url: str, **settings: Any) -> dict[str, str]:
    """This process's environment without its gateway settings, plus the test's: ``name=value``
    becomes ``GATEWAY_NAME``. Logs are JSON events at INFO unless the test says otherwise."""
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
    for name, value in settings.items():
        env[f"GATEWAY_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

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


def start_gateway(
    env: dict[str, str], log_path: Path, *args: str, cwd: Path | None = None
) -> GatewayProcess:
    """``python -m gateway serve`` on a free loopback port; stderr and stdout go to ``log_path``."""
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd or ROOT,
        )
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


@contextmanager
def gateways(database_url: str, count: int, **settings: Any) -> Iterator[list[GatewayProcess]]:
    """``count`` ready `gateway serve` processes sharing one database, stopped afterwards;
    they log warnings only unless the test says otherwise."""
    env = gateway_env(database_url, **{"log_level": "WARNING", **settings})
    with tempfile.TemporaryDirectory(prefix="gateway-logs-") as logs:
        started: list[GatewayProcess] = []
        try:
            for index in range(count):
                started.append(start_gateway(env, Path(logs) / f"gateway-{index}.log"))
            wait_until_ready(*started)
            yield started
        finally:
            for gateway in started:
                gateway.stop()


def run_cli(database_url: str, *args: str, **settings: Any) -> subprocess.CompletedProcess[str]:
    """``python -m gateway *args`` to its end, its output captured (warnings only in the log)."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        env=gateway_env(database_url, **{"log_level": "WARNING", **settings}),
        capture_output=True,
        text=True,
        timeout=60,
    )
