"""Throughput of the guarded hot path against a bare baseline, measured in the same run.

Starts, on PostgreSQL and on the same server stack (uvicorn, uvloop, httptools, one
worker each):
- the gateway (`gateway serve`), and
- bench/baseline_app.py: a bare Litestar endpoint that decodes the JWT and inserts one
  row with raw asyncpg.

Then drives them alternately with wrk at the same concurrency, every request carrying
fresh tool_call ids and fresh arguments, spread over 32 runs:
- gateway, one call per request      (compared with the baseline: target >= 0.8)
- baseline, one insert per request
- gateway, a batch of 8 calls        (calls/s compared with single calls: target >= 3x)
three times, and prints the medians of requests/s, p50 and p99 and their ratios.

    .venv/bin/python bench/hot_path.py [--duration 5] [--repeats 3] [--connections 32]

Needs wrk (`apt-get install wrk`) and a PostgreSQL server (BENCH_DATABASE_URL, default
postgresql://postgres@127.0.0.1:5432/postgres); it creates and drops its own database.
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
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.auth.dev_tokens import mint_token  # noqa: E402
from gateway.settings import Settings  # noqa: E402

SECRET = "bench-secret-" + "x" * 40
RESULT = re.compile(
    r"RESULT requests=(\d+) duration_us=(\d+) errors=(\d+) p50_us=(\d+) p99_us=(\d+) non2xx=(\d+)"
)


@dataclass
class Sample:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


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


def wait_until_up(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def wrk(url: str, args: list[str], *, connections: int, duration: int) -> Sample:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(ROOT / "bench/tool_calls.lua"),
         url, "--", *args],
        capture_output=True, text=True, check=True,
    ).stdout
    match = RESULT.search(out)
    if match is None:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    requests, duration_us, errors, p50, p99, non2xx = map(int, match.groups())
    return Sample(rps=requests / (duration_us / 1e6), p50_ms=p50 / 1000, p99_ms=p99 / 1000, errors=errors + non2xx)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--runs", type=int, default=32, help="how many gateway runs the load is spread over")
    parser.add_argument("--log-level", default="INFO", help="the gateway's GATEWAY_LOG_LEVEL during the bench")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("bench: wrk is needed (Debian: apt-get install wrk)", file=sys.stderr)
        return 2

    server_dsn = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    database = f"gateway_bench_{uuid.uuid4().hex[:8]}"
    db_dsn = server_dsn.rsplit("/", 1)[0] + "/" + database
    asyncio.run(admin(server_dsn, f'CREATE DATABASE "{database}"'))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        env = {
            **os.environ,
            "GATEWAY_DATABASE_URL": db_dsn.replace("postgresql://", "postgresql+asyncpg://", 1),
            "GATEWAY_JWT_SECRET": SECRET,
            "GATEWAY_LOG_LEVEL": args.log_level,
            "BENCH_BASELINE_DSN": db_dsn,
        }
        gateway = str(ROOT / ".venv/bin/gateway") if (ROOT / ".venv/bin/gateway").exists() else "gateway"
        subprocess.run([gateway, "migrate"], env=env, check=True, capture_output=True)
        subprocess.run([gateway, "seed-demo"], env=env, check=True, capture_output=True)

        gateway_port, baseline_port = free_port(), free_port()
        log = open(ROOT / "bench" / "last-run.log", "wb")  # noqa: SIM115
        processes.append(subprocess.Popen(
            [gateway, "serve", "--host", "127.0.0.1", "--port", str(gateway_port)], env=env, stdout=log, stderr=log
        ))
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bench.baseline_app:app", "--host", "127.0.0.1", "--port",
             str(baseline_port), "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level",
             "warning"],
            env=env, cwd=ROOT, stdout=log, stderr=log,
        ))
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        baseline_url = f"http://127.0.0.1:{baseline_port}"
        wait_until_up(gateway_url + "/healthz")
        wait_until_up(baseline_url + "/")

        settings = Settings(database_url=env["GATEWAY_DATABASE_URL"], jwt_secret=SECRET)
        token = mint_token(settings, tenant_id="acme", user_id="alice", roles=["member"], ttl_s=3600)
        runs = []
        with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {token}"}) as client:
            for _ in range(args.runs):
                response = client.post("/v1/runs", json={"max_tool_calls": 100_000})
                response.raise_for_status()
                runs.append(response.json()["id"])

        def drive(url: str, batch: int, label: str) -> Sample:
            prefix = f"{label}{uuid.uuid4().hex[:6]}"
            return wrk(url, [token, prefix, str(batch), *runs], connections=args.connections, duration=args.duration)

        print(f"warming up ({args.connections} connections, {args.runs} runs) ...", file=sys.stderr)
        drive(gateway_url, 1, "w")
        drive(baseline_url, 1, "w")
        drive(gateway_url, 8, "w")

        single, base, batch = [], [], []
        for repeat in range(1, args.repeats + 1):
            single.append(drive(gateway_url, 1, "s"))
            base.append(drive(baseline_url, 1, "b"))
            batch.append(drive(gateway_url, 8, "m"))
            print(
                f"round {repeat}: gateway {single[-1].rps:7.0f} req/s | baseline {base[-1].rps:7.0f} req/s | "
                f"batch-8 {batch[-1].rps * 8:7.0f} calls/s",
                file=sys.stderr,
            )
        report(single, base, batch)
        errors = sum(s.errors for s in single + base + batch)
        if errors:
            print(f"WARNING: {errors} failed or non-2xx requests; see bench/last-run.log", file=sys.stderr)
        return 0
    finally:
        for process in processes:
            process.send_signal(signal.SIGINT)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        asyncio.run(admin(server_dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


def median(samples: list[Sample], attr: str) -> float:
    return statistics.median(getattr(s, attr) for s in samples)


def report(single: list[Sample], base: list[Sample], batch: list[Sample]) -> None:
    rows = [
        ("gateway, 1 call/request", single, 1),
        ("baseline (JWT + 1 INSERT)", base, 1),
        ("gateway, 8 calls/request", batch, 8),
    ]
    print(f"\n{'medians of ' + str(len(single)) + ' rounds':<28} {'req/s':>9} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for label, samples, calls in rows:
        rps = median(samples, "rps")
        print(f"{label:<28} {rps:9.0f} {rps * calls:9.0f} {median(samples, 'p50_ms'):8.2f} "
              f"{median(samples, 'p99_ms'):8.2f}")
    single_rps, base_rps = median(single, "rps"), median(base, "rps")
    batch_calls = median(batch, "rps") * 8
    print(f"\nratio gateway/baseline throughput: {single_rps / base_rps:.2f}  (target >= 0.80)")
    print(f"ratio gateway/baseline p50:        {median(single, 'p50_ms') / median(base, 'p50_ms'):.2f}")
    print(f"ratio gateway/baseline p99:        {median(single, 'p99_ms') / median(base, 'p99_ms'):.2f}")
    print(f"ratio batch-8/single calls per s:  {batch_calls / single_rps:.2f}  (target >= 3.00)")
    # The machine's speed drifts over a run; a round's samples are taken back to back, so the
    # ratio within each round cancels most of the drift. Their median is the steadier figure.
    paired = statistics.median(s.rps / b.rps for s, b in zip(single, base, strict=True))
    paired_batch = statistics.median(m.rps * 8 / s.rps for s, m in zip(single, batch, strict=True))
    print(f"\nmedian of per-round ratios: gateway/baseline {paired:.2f}, batch-8/single {paired_batch:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
