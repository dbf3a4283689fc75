"""What the benchmarks share: a database of their own, the gateway and the servers they
start, wrk with the result line its scripts print, and the medians they report.

The scripts put the repository on ``sys.path`` before importing this module, so that they
run as ``.venv/bin/python bench/<script>.py`` from anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import asyncpg
import httpx

from prometheus_client.parser import text_string_to_metric_families

from gateway.auth.dev_tokens import mint_token
from gateway.observability.timing import STAGES
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-secret-" + "x" * 40
# The baseline's table and its one statement per request (bench/baseline_app.py, and the
# reference bench/statement_cost.py compares the ledger's statements with).
BASELINE_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_events (id bigserial PRIMARY KEY, tenant text, subject text, body text)"
)
BASELINE_INSERT = "INSERT INTO bench_events (tenant, subject, body) VALUES ($1, $2, $3)"
RESULT = re.compile(
    r"RESULT requests=(\d+) duration_us=(\d+) errors=(\d+) p50_us=(\d+) p99_us=(\d+) non2xx=(\d+)"
)
"""The line the wrk scripts print when they are done (bench/common.lua)."""

BENCH_RATE_LIMIT_RPS = "1000000"
BENCH_REMOTE_CALLS_PER_TENANT = "100000"
"""Per tenant and per user: on, as in the default configuration, and never reached."""

Processes = list[subprocess.Popen[bytes]]


@dataclass
class Sample:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int = 0


def add_load_options(parser: argparse.ArgumentParser, *, duration: int, repeats: int, connections: int) -> None:
    """The options every benchmark takes, with its own defaults."""
    parser.add_argument("--duration", type=int, default=duration, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--connections", type=int, default=connections)
    parser.add_argument("--runs", type=int, default=32, help="how many gateway runs the load is spread over")
    parser.add_argument("--log-level", default="INFO", help="the gateway's GATEWAY_LOG_LEVEL during the bench")


def wrk_missing() -> bool:
    if shutil.which("wrk") is not None:
        return False
    print("bench: wrk is needed (Debian: apt-get install wrk)", file=sys.stderr)
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def admin(dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@contextmanager
def bench_database(prefix: str) -> Iterator[str]:
    """A fresh database on the server of BENCH_DATABASE_URL, dropped afterwards: its DSN."""
    server_dsn = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    database = f"{prefix}_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(server_dsn, f'CREATE DATABASE "{database}"'))
    try:
        yield server_dsn.rsplit("/", 1)[0] + "/" + database
    finally:
        asyncio.run(admin(server_dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


def gateway_url_for(dsn: str) -> str:
    """The gateway's GATEWAY_DATABASE_URL for a plain PostgreSQL DSN."""
    return dsn.replace("postgresql://", "postgresql+asyncpg://", 1)


def gateway_env(
    dsn: str, *, log_level: str, environ: Mapping[str, str] = os.environ, **extra: str
) -> dict[str, str]:
    return {
        **environ,
        "GATEWAY_DATABASE_URL": gateway_url_for(dsn),
        "GATEWAY_JWT_SECRET": SECRET,
        "GATEWAY_LOG_LEVEL": log_level,
        # Rate limits on, as by default, but far above what one machine can send, so that
        # the limiter's cost is measured and it never refuses; a bench run can pass its own.
        "GATEWAY_RATE_LIMIT_TENANT_RPS": BENCH_RATE_LIMIT_RPS,
        "GATEWAY_RATE_LIMIT_USER_RPS": BENCH_RATE_LIMIT_RPS,
        # The same for the turns a tenant's remote tool calls take: the load is one tenant's.
        "GATEWAY_TOOL_MAX_REMOTE_CALLS_PER_TENANT": BENCH_REMOTE_CALLS_PER_TENANT,
        **extra,
    }


def gateway_command() -> str:
    """The checkout's own ``gateway`` when it has a .venv, else the one on PATH."""
    local = ROOT / ".venv/bin/gateway"
    return str(local) if local.exists() else "gateway"


def prepare_gateway(env: Mapping[str, str]) -> None:
    """Migrate the bench database and seed the demo tenant (``acme``, user ``alice``)."""
    for command in ("migrate", "seed-demo"):
        subprocess.run([gateway_command(), command], env=env, check=True, capture_output=True)


def open_log() -> IO[bytes]:
    """Where the started servers write: bench/last-run.log, for a look after a bad run."""
    return open(ROOT / "bench" / "last-run.log", "wb")  # noqa: SIM115


def start_gateway(port: int, env: Mapping[str, str], log: IO[bytes], *options: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [gateway_command(), "serve", "--host", "127.0.0.1", "--port", str(port), *options],
        env=env, stdout=log, stderr=log,
    )


def start_uvicorn(
    app: str, port: int, env: Mapping[str, str], log: IO[bytes], *options: str
) -> subprocess.Popen[bytes]:
    """An app of this repository on the gateway's server stack (uvloop, httptools, no access log)."""
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", app, *options, "--host", "127.0.0.1", "--port", str(port),
         "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"],
        env=env, cwd=ROOT, stdout=log, stderr=log,
    )


def stop(processes: Processes, *, sig: signal.Signals = signal.SIGINT, timeout: float = 15) -> None:
    """Ask every process to stop, then wait for each; one that does not stop in time is killed."""
    for process in processes:
        process.send_signal(sig)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until_up(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def member_token(database_url: str) -> str:
    """A token of the seeded demo user, ``alice`` of ``acme`` (role ``member``), for an hour."""
    settings = Settings.from_flat(database_url=database_url, jwt_secret=SECRET)
    return mint_token(settings, tenant_id="acme", user_id="alice", roles=["member"], ttl_s=3600)


def gateway_client(gateway_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {token}"})


def create_runs(client: httpx.Client, count: int, *, max_tool_calls: int) -> list[str]:
    """The runs the load is spread over; their ids."""
    runs = []
    for _ in range(count):
        response = client.post("/v1/runs", json={"max_tool_calls": max_tool_calls})
        response.raise_for_status()
        runs.append(response.json()["id"])
    return runs


def fresh_prefix(label: str) -> str:
    """A prefix for the tool_call ids of one wrk run, so that no two runs repeat an id."""
    return f"{label}{uuid.uuid4().hex[:6]}"


def wrk(
    url: str, script: str, args: list[str], *, connections: int, duration: int, under: Iterable[str] = ()
) -> Sample:
    """One wrk run with bench/``script``, given ``args`` after ``--``; ``under`` is a command
    to start it under (``taskset -c 3``)."""
    out = subprocess.run(
        [*under, "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(ROOT / "bench" / script),
         url, "--", *args],
        capture_output=True, text=True, check=True,
    ).stdout
    match = RESULT.search(out)
    if match is None:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    requests, duration_us, errors, p50, p99, non2xx = map(int, match.groups())
    return Sample(rps=requests / (duration_us / 1e6), p50_ms=p50 / 1000, p99_ms=p99 / 1000, errors=errors + non2xx,
                  requests=requests)


class StageTimes:
    """Where the gateway's tool-call requests spent their time between two readings of its
    stage counters (``/metrics``: the ``Server-Timing`` stages added up), per request."""

    def __init__(self, gateway_url: str) -> None:
        self._url = gateway_url + "/metrics"
        self._last: dict[str, float] | None = None
        self.reset()

    def reset(self) -> None:
        """Forget what was counted (a warm-up's)."""
        self._spent = dict.fromkeys(STAGES, 0.0)
        self._requests = 0.0

    def mark(self) -> None:
        """Start counting from now (the time since the last reading is not counted)."""
        self._last = self._read()

    def add(self) -> None:
        """Count the requests since the last reading."""
        now = self._read()
        if self._last is not None:
            for stage in STAGES:
                self._spent[stage] += now[stage] - self._last[stage]
            self._requests += now["requests"] - self._last["requests"]
        self._last = now

    def line(self) -> str:
        if not self._requests:
            return "no tool-call requests timed"
        stages = ", ".join(f"{stage} {1000 * self._spent[stage] / self._requests:.2f}" for stage in STAGES)
        return f"ms per request by stage ({self._requests:.0f} requests): {stages}"

    def _read(self) -> dict[str, float]:
        values = dict.fromkeys((*STAGES, "requests"), 0.0)
        for family in text_string_to_metric_families(httpx.get(self._url, timeout=10).text):
            for sample in family.samples:
                if sample.name == "gateway_stage_seconds_total" and sample.labels.get("stage") in values:
                    values[sample.labels["stage"]] = sample.value
                elif sample.name == "gateway_tool_call_requests_total":
                    values["requests"] = sample.value
        return values


def median(samples: list[Sample], attr: str) -> float:
    return statistics.median(getattr(s, attr) for s in samples)


def warn_on_errors(samples: Iterable[Sample]) -> None:
    errors = sum(s.errors for s in samples)
    if errors:
        print(f"WARNING: {errors} failed or non-2xx requests; see bench/last-run.log", file=sys.stderr)


@dataclass
class GatewayAndBaseline:
    """The gateway and the bare baseline endpoint, serving one bench database, and the load's
    token and runs: what bench/hot_path.py and bench/cpu_per_call.py both drive."""

    gateway: subprocess.Popen[bytes]
    baseline: subprocess.Popen[bytes]
    gateway_url: str
    baseline_url: str
    token: str
    runs: list[str]


def start_gateway_and_baseline(
    db_dsn: str, processes: Processes, *, log_level: str, runs: int, max_tool_calls: int
) -> GatewayAndBaseline:
    """Migrate and seed the database, start both servers (added to ``processes``, which the
    caller stops), wait until they answer and create the runs the load is spread over."""
    env = gateway_env(db_dsn, log_level=log_level, BENCH_BASELINE_DSN=db_dsn)
    prepare_gateway(env)
    gateway_port, baseline_port = free_port(), free_port()
    log = open_log()
    gateway = start_gateway(gateway_port, env, log)
    processes.append(gateway)
    baseline = start_uvicorn("bench.baseline_app:app", baseline_port, env, log)
    processes.append(baseline)
    gateway_url, baseline_url = f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{baseline_port}"
    wait_until_up(gateway_url + "/healthz")
    wait_until_up(baseline_url + "/")
    token = member_token(env["GATEWAY_DATABASE_URL"])
    with gateway_client(gateway_url, token) as client:
        run_ids = create_runs(client, runs, max_tool_calls=max_tool_calls)
    return GatewayAndBaseline(gateway, baseline, gateway_url, baseline_url, token, run_ids)
