"""Does a gateway worker's memory grow with the calls it serves? Its RSS after the first
10,000 guarded calls against its RSS after N (target: within 10 %).

Starts one gateway worker (`gateway serve`, one process) on PostgreSQL, then drives it with
wrk in rounds of `--round` seconds, every request carrying fresh tool_call ids and fresh
arguments, spread over `--runs` runs whose budgets are large enough for all N calls. It
reads the worker's resident set size (VmRSS in /proc/<pid>/status) once 10,000 calls have
been served and again once N have, prints both and their ratio, and the RSS after every
round on stderr, so that a slow climb shows even where the end points happen to agree.

    .venv/bin/python bench/memory.py [--calls 1000000] [--batch 1] [--connections 32]
    .venv/bin/python bench/memory.py --calls 20000 --round 2   # smoke run

Linux only (/proc). Needs wrk (`apt-get install wrk`) and a PostgreSQL server
(BENCH_DATABASE_URL, default postgresql://postgres@127.0.0.1:5432/postgres); it creates and
drops its own database. The gateway logs at WARNING by default (`--log-level`), so that a
million calls do not write a million log lines to bench/last-run.log.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

WARM_CALLS = 10_000
TARGET_RATIO = 1.10


def rss_mib(pid: int) -> float:
    """The resident set size of one process in MiB (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid} has no VmRSS: gone?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_load_options(parser, duration=10, repeats=1, connections=32)
    parser.set_defaults(log_level="WARNING")
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls to serve in all (N)")
    parser.add_argument("--batch", type=int, default=1, help="calls per request")
    parser.add_argument("--round", type=int, default=10, help="seconds per wrk run")
    args = parser.parse_args()
    if args.calls <= WARM_CALLS:
        parser.error(f"--calls must be more than the {WARM_CALLS} warm-up calls")
    if common.wrk_missing():
        return 2

    with common.bench_database("gateway_mem") as db_dsn:
        processes: common.Processes = []
        try:
            # Room for every call in every run's budget, with a margin for the last round.
            budget = 2 * args.calls // args.runs + 100_000
            servers = common.start_gateway_and_baseline(
                db_dsn, processes, log_level=args.log_level, runs=args.runs, max_tool_calls=budget
            )
            common.stop([servers.baseline])  # only the gateway is measured here
            pid = servers.gateway.pid
            started_mib = rss_mib(pid)
            served, errors, started = 0, 0, time.monotonic()
            warm_mib: float | None = None

            def round_of(seconds: int) -> None:
                nonlocal served, errors
                sample = common.wrk(
                    servers.gateway_url, "tool_calls.lua",
                    [servers.token, common.fresh_prefix("m"), str(args.batch), *servers.runs],
                    connections=args.connections, duration=seconds,
                )
                served += sample.requests * args.batch
                errors += sample.errors

            while served < WARM_CALLS:
                round_of(1)
            warm_mib, warm_calls = rss_mib(pid), served
            print(f"after {served:>9,} calls: RSS {warm_mib:7.1f} MiB (at start {started_mib:.1f})", file=sys.stderr)
            while served < args.calls:
                round_of(args.round)
                print(f"after {served:>9,} calls: RSS {rss_mib(pid):7.1f} MiB "
                      f"({served / (time.monotonic() - started):.0f} calls/s)", file=sys.stderr)
            final_mib = rss_mib(pid)
        finally:
            common.stop(processes)

    ratio = final_mib / warm_mib
    print(f"\none gateway worker, {args.connections} connections, {args.batch} call(s)/request, "
          f"{args.runs} runs, fresh ids and arguments")
    print(f"RSS after {warm_calls:>9,} calls: {warm_mib:7.1f} MiB")
    print(f"RSS after {served:>9,} calls: {final_mib:7.1f} MiB")
    print(f"ratio: {ratio:.3f}  (target <= {TARGET_RATIO:.2f}: {'met' if ratio <= TARGET_RATIO else 'NOT met'})")
    if errors:
        print(f"WARNING: {errors} failed or non-2xx requests; see bench/last-run.log", file=sys.stderr)
    return 0 if ratio <= TARGET_RATIO and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
