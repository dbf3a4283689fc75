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

With `--pin`, where the machine has the cores (N for the workers, ceil(N/2) for PostgreSQL,
one for wrk; bench/pinning.py), each N runs with the servers' worker processes, the benchmark
PostgreSQL server (its postmaster and backends, found as bench/cpu_per_call.py finds them)
and wrk pinned to separate cores with `taskset`; where it has not, the run says so and that
N runs unpinned. PostgreSQL's own affinity is restored at the end: use a server of its own.

    .venv/bin/python bench/scale_out.py --pin --workers 1,2,4
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, pinning  # noqa: E402
from bench.common import Sample, median  # noqa: E402
from bench.cpu_per_call import postmaster_of  # noqa: E402


@dataclass
class Row:
    workers: int
    gateway: list[Sample]
    baseline: list[Sample]
    pinned: bool = False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_load_options(parser, duration=5, repeats=3, connections=64)
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--pin", action="store_true",
                        help="pin the workers, PostgreSQL and wrk to separate cores where there are enough")
    args = parser.parse_args()
    worker_counts = [int(n) for n in args.workers.split(",") if n.strip()]
    if common.wrk_missing():
        return 2

    with common.bench_database("gateway_bench") as db_dsn, common.open_log() as log:
        env = common.gateway_env(
            db_dsn,
            log_level=args.log_level,
            environ={k: v for k, v in os.environ.items() if not k.startswith("PROMETHEUS_")},
            BENCH_BASELINE_DSN=db_dsn,
        )
        rows: list[Row] = []
        common.prepare_gateway(env)
        token = common.member_token(env["GATEWAY_DATABASE_URL"])
        runs: list[str] = []
        cores = pinning.usable_cores()
        postmaster = postmaster_of(db_dsn) if args.pin else 0
        for workers in worker_counts:
            plan: pinning.Plan | None = None
            if args.pin:
                found = pinning.plan_for(workers, cores)
                if isinstance(found, str):
                    print(f"{workers} worker(s): NOT pinned: {found}", file=sys.stderr)
                else:
                    plan = found
            gateway_port, baseline_port = common.free_port(), common.free_port()
            processes: common.Processes = [
                common.start_gateway(gateway_port, env, log, "--workers", str(workers), "--no-migrate"),
                common.start_uvicorn("bench.baseline_app:app", baseline_port, env, log, "--workers", str(workers)),
            ]
            try:
                gateway_url = f"http://127.0.0.1:{gateway_port}"
                baseline_url = f"http://127.0.0.1:{baseline_port}"
                common.wait_until_up(gateway_url + "/readyz", timeout=60)
                common.wait_until_up(baseline_url + "/", timeout=60)
                if plan is not None:
                    pinned = (pinning.pin(processes[0].pid, plan.servers), pinning.pin(processes[1].pid, plan.servers),
                              pinning.pin(postmaster, plan.postgres))
                    print(f"{workers} worker(s): pinned {plan.describe()} ({pinned[0]} gateway, "
                          f"{pinned[1]} baseline, {pinned[2]} PostgreSQL processes)", file=sys.stderr)
                if not runs:
                    with common.gateway_client(gateway_url, token) as client:
                        runs = common.create_runs(client, args.runs, max_tool_calls=10_000_000)

                def drive(url: str, label: str) -> Sample:
                    prefix = common.fresh_prefix(f"{label}{workers}")
                    return common.wrk(url, "tool_calls.lua", [token, prefix, "1", *runs],
                                      connections=args.connections, duration=args.duration,
                                      under=pinning.wrk_prefix(plan))

                print(f"{workers} worker(s): warming up ({args.connections} connections) ...", file=sys.stderr)
                drive(gateway_url, "w")
                drive(baseline_url, "w")
                row = Row(workers=workers, gateway=[], baseline=[], pinned=plan is not None)
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
                common.stop(processes, sig=signal.SIGTERM, timeout=40)
                if plan is not None:
                    pinning.pin(postmaster, cores)  # PostgreSQL back on every core
        report(rows, args.connections)
        common.warn_on_errors(s for row in rows for s in row.gateway + row.baseline)
        return 0


def report(rows: list[Row], connections: int) -> None:
    print(f"\nfull guarded path, 1 call/request, {connections} connections; medians of "
          f"{len(rows[0].gateway) if rows else 0} rounds")
    print(f"{'workers':>7} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'baseline/s':>11} {'b. p50':>7} "
          f"{'b. p99':>7} {'ratio':>6} {'pinned':>6}")
    for row in rows:
        rps, base = median(row.gateway, "rps"), median(row.baseline, "rps")
        print(
            f"{row.workers:>7} {rps:9.0f} {median(row.gateway, 'p50_ms'):8.2f} {median(row.gateway, 'p99_ms'):8.2f} "
            f"{base:11.0f} {median(row.baseline, 'p50_ms'):7.2f} {median(row.baseline, 'p99_ms'):7.2f} "
            f"{rps / base:6.2f} {'yes' if row.pinned else 'no':>6}"
        )
    print("ratio: the gateway's calls/s over the baseline's requests/s with the same number of workers")


if __name__ == "__main__":
    raise SystemExit(main())
