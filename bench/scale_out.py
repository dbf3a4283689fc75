"""The full guarded path under load with 1, 2 and 4 worker processes, against the bare baseline.

For each worker count N it starts, on PostgreSQL and the same server stack (uvicorn,
uvloop, httptools, N workers each):
- the gateway (`gateway serve --workers N`): auth, validation, permission, budget, tool,
  audit, one call per request, and
- bench/baseline_app.py: a bare endpoint that decodes the JWT and inserts one row,
then drives them alternately with wrk at 64 connections (every request with fresh
tool_call ids and arguments, spread over 32 runs), `--repeats` times, and prints per N
the medians of calls/s, p50 and p99 and the ratio of the gateway's throughput to the
baseline's at the same N.

    .venv/bin/python bench/scale_out.py [--duration 5] [--repeats 3] [--workers 1,2,4]
    .venv/bin/python bench/scale_out.py --duration 1 --repeats 1 --workers 1   # smoke run

Needs wrk (`apt-get install wrk`) and PostgreSQL (BENCH_DATABASE_URL, default
postgresql://postgres@127.0.0.1:5432/postgres); it creates and drops its own database.
On a small machine, more workers than cores measure contention, not scale.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hot_path import SECRET, Sample, admin, free_port, median, wait_until_up, wrk  # noqa: E402
from gateway.auth.dev_tokens import mint_token  # noqa: E402
from gateway.settings import Settings  # noqa: E402


@dataclass
class Row:
    workers: int
    gateway: list[Sample]
    baseline: list[Sample]


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--runs", type=int, default=32, help="how many gateway runs the load is spread over")
    parser.add_argument("--log-level", default="INFO", help="the gateway's GATEWAY_LOG_LEVEL during the bench")
    args = parser.parse_args()
    worker_counts = [int(n) for n in args.workers.split(",") if n.strip()]
    if shutil.which("wrk") is None:
        print("bench: wrk is needed (Debian: apt-get install wrk)", file=sys.stderr)
        return 2

    server_dsn = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    database = f"gateway_bench_{uuid.uuid4().hex[:8]}"
    db_dsn = server_dsn.rsplit("/", 1)[0] + "/" + database
    asyncio.run(admin(server_dsn, f'CREATE DATABASE "{database}"'))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PROMETHEUS_")},
        "GATEWAY_DATABASE_URL": db_dsn.replace("postgresql://", "postgresql+asyncpg://", 1),
        "GATEWAY_JWT_SECRET": SECRET,
        "GATEWAY_LOG_LEVEL": args.log_level,
        "BENCH_BASELINE_DSN": db_dsn,
    }
    gateway = str(ROOT / ".venv/bin/gateway") if (ROOT / ".venv/bin/gateway").exists() else "gateway"
    rows: list[Row] = []
    log = open(ROOT / "bench" / "last-run.log", "wb")  # noqa: SIM115
    try:
        subprocess.run([gateway, "migrate"], env=env, check=True, capture_output=True)
        subprocess.run([gateway, "seed-demo"], env=env, check=True, capture_output=True)
        settings = Settings(database_url=env["GATEWAY_DATABASE_URL"], jwt_secret=SECRET)
        token = mint_token(settings, tenant_id="acme", user_id="alice", roles=["member"], ttl_s=3600)
        runs: list[str] = []
        for workers in worker_counts:
            gateway_port, baseline_port = free_port(), free_port()
            processes = [
                subprocess.Popen(
                    [gateway, "serve", "--host", "127.0.0.1", "--port", str(gateway_port), "--workers", str(workers),
                     "--no-migrate"],
                    env=env, stdout=log, stderr=log,
                ),
                subprocess.Popen(
                    [sys.executable, "-m", "uvicorn", "bench.baseline_app:app", "--host", "127.0.0.1", "--port",
                     str(baseline_port), "--workers", str(workers), "--loop", "uvloop", "--http", "httptools",
                     "--no-access-log", "--log-level", "warning"],
                    env=env, cwd=ROOT, stdout=log, stderr=log,
                ),
            ]
            try:
                gateway_url = f"http://127.0.0.1:{gateway_port}"
                baseline_url = f"http://127.0.0.1:{baseline_port}"
                wait_until_up(gateway_url + "/readyz", timeout=60)
                wait_until_up(baseline_url + "/", timeout=60)
                if not runs:
                    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {token}"}) as client:
                        for _ in range(args.runs):
                            response = client.post("/v1/runs", json={"max_tool_calls": 10_000_000})
                            response.raise_for_status()
                            runs.append(response.json()["id"])

                def drive(url: str, label: str) -> Sample:
                    prefix = f"{label}{workers}{uuid.uuid4().hex[:6]}"
                    return wrk(url, [token, prefix, "1", *runs], connections=args.connections,
                               duration=args.duration)

                print(f"{workers} worker(s): warming up ({args.connections} connections) ...", file=sys.stderr)
                drive(gateway_url, "w")
                drive(baseline_url, "w")
                row = Row(workers=workers, gateway=[], baseline=[])
                for repeat in range(1, args.repeats + 1):
                    row.gateway.append(drive(gateway_url, "g"))
                    row.baseline.append(drive(baseline_url, "b"))
                    print(
                        f"  round {repeat}: gateway {row.gateway[-1].rps:7.0f} calls/s | "
                        f"baseline {row.baseline[-1].rps:7.0f} req/s",
                        file=sys.stderr,
                    )
                rows.append(row)
            finally:
                stop(processes)
        report(rows, args.connections)
        errors = sum(s.errors for row in rows for s in row.gateway + row.baseline)
        if errors:
            print(f"WARNING: {errors} failed or non-2xx requests; see bench/last-run.log", file=sys.stderr)
        return 0
    finally:
        log.close()
        asyncio.run(admin(server_dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


def report(rows: list[Row], connections: int) -> None:
    print(f"\nfull guarded path, 1 call/request, {connections} connections; medians of "
          f"{len(rows[0].gateway) if rows else 0} rounds")
    print(f"{'workers':>7} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'baseline/s':>11} {'b. p50':>7} "
          f"{'b. p99':>7} {'ratio':>6}")
    for row in rows:
        rps, base = median(row.gateway, "rps"), median(row.baseline, "rps")
        print(
            f"{row.workers:>7} {rps:9.0f} {median(row.gateway, 'p50_ms'):8.2f} {median(row.gateway, 'p99_ms'):8.2f} "
            f"{base:11.0f} {median(row.baseline, 'p50_ms'):7.2f} {median(row.baseline, 'p99_ms'):7.2f} "
            f"{rps / base:6.2f}"
        )
    print("ratio: the gateway's calls/s over the baseline's requests/s with the same number of workers")


if __name__ == "__main__":
    raise SystemExit(main())
