"""CPU time per guarded call, in the gateway's process and in PostgreSQL, against the bare
baseline endpoint's CPU per insert, measured in the same run.

Throughput on a shared machine drifts by tens of percent between runs; the CPU a process
spends per call drifts far less, so it is the figure to compare versions by. Starts the
gateway and bench/baseline_app.py (one worker each, on PostgreSQL), then alternately drives
with wrk: the gateway with one call per request, the baseline, the gateway with a batch of
8 calls. For each it reads the serving process's CPU time (/proc) and the CPU time of every
PostgreSQL server process before and after, and prints microseconds per call and the
gateway/baseline ratios. It also prints the whole machine's CPU per call (every process: the
load generator's and anything else running, /proc/stat) and how busy the serving process
and the machine were: a serving process below one core on a machine near all of its cores
is held back by the machine, not by its own CPU, and moving its work to another process
would not make it faster.

    .venv/bin/python bench/cpu_per_call.py [--duration 6] [--repeats 3] [--connections 32]

Linux only (/proc); PostgreSQL's CPU is its server's: the postmaster behind the benchmark's
database and its children, so another server on the machine (a test suite's) is not counted.
On a machine where other work uses PostgreSQL, give the benchmark a server of its own. Needs wrk and a
PostgreSQL server (BENCH_DATABASE_URL, default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg  # noqa: E402

from bench import common  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of one process, 0.0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def postmaster_of(dsn: str) -> int:
    """The PID of the server behind ``dsn``: the parent of one of its backends."""

    async def read() -> int:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:  # read while the backend lives
            return parent_pid(int(await conn.fetchval("SELECT pg_backend_pid()")))
        finally:
            await conn.close()

    return asyncio.run(read())


def postgres_cpu_s(postmaster: int) -> float:
    """CPU seconds of the benchmark's PostgreSQL server: its postmaster and every process it
    started (other servers on the machine, such as a test suite's, are not counted)."""
    total = process_cpu_s(postmaster)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_pid(int(entry)) != postmaster:
                    continue
            except (OSError, ValueError, IndexError):
                continue
            total += process_cpu_s(int(entry))
    return total


def machine_cpu_s() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, every core (``/proc/stat``):
    busy is everything but idle and I/O wait."""
    with open("/proc/stat") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / TICKS, sum(ticks) / TICKS


def measure(
    pid: int, postmaster: int, drive: object, calls_per_request: int, duration_s: int
) -> tuple[float, float, float, float, float, float]:
    """Of one wrk run: requests/s; gateway-or-baseline, PostgreSQL and whole-machine µs per
    call; the serving process's and the machine's busy share (1.0: one core, all cores)."""
    process_before, postgres_before = process_cpu_s(pid), postgres_cpu_s(postmaster)
    machine_before, all_before = machine_cpu_s()
    sample: common.Sample = drive()  # type: ignore[operator]
    process_after, postgres_after = process_cpu_s(pid), postgres_cpu_s(postmaster)
    machine_after, all_after = machine_cpu_s()
    calls = sample.rps * duration_s * calls_per_request
    cores = os.cpu_count() or 1
    wall_s = (all_after - all_before) / cores
    return (
        sample.rps,
        1e6 * (process_after - process_before) / calls,
        1e6 * (postgres_after - postgres_before) / calls,
        1e6 * (machine_after - machine_before) / calls,
        (process_after - process_before) / wall_s if wall_s else 0.0,
        (machine_after - machine_before) / (all_after - all_before) if all_after > all_before else 0.0,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_load_options(parser, duration=6, repeats=3, connections=32)
    args = parser.parse_args()
    if common.wrk_missing():
        return 2

    with common.bench_database("gateway_cpu") as db_dsn:
        processes: common.Processes = []
        try:
            servers = common.start_gateway_and_baseline(
                db_dsn, processes, log_level=args.log_level, runs=args.runs, max_tool_calls=1_000_000
            )
            gateway, baseline = servers.gateway, servers.baseline
            gateway_url, baseline_url, token, runs = servers.gateway_url, servers.baseline_url, servers.token, servers.runs

            def driver(url: str, batch: int, label: str, duration: int) -> object:
                return lambda: common.wrk(url, "tool_calls.lua", [token, common.fresh_prefix(label), str(batch), *runs],
                                          connections=args.connections, duration=duration)

            for url, batch in ((gateway_url, 1), (baseline_url, 1), (gateway_url, 8)):
                driver(url, batch, "w", 2)()  # warm up
            rows: dict[str, list[tuple[float, float, float, float, float, float]]] = {
                "single": [], "baseline": [], "batch": []
            }
            postmaster = postmaster_of(db_dsn)
            for _ in range(args.repeats):
                rows["single"].append(measure(gateway.pid, postmaster, driver(gateway_url, 1, "s", args.duration), 1, args.duration))
                rows["baseline"].append(measure(baseline.pid, postmaster, driver(baseline_url, 1, "b", args.duration), 1, args.duration))
                rows["batch"].append(measure(gateway.pid, postmaster, driver(gateway_url, 8, "m", args.duration), 8, args.duration))
            report(rows)
            return 0
        finally:
            common.stop(processes)


def report(rows: dict[str, list[tuple[float, float, float, float, float, float]]]) -> None:
    def med(name: str, index: int) -> float:
        return statistics.median(row[index] for row in rows[name])

    labels = {"single": "gateway, 1 call/request", "baseline": "baseline (JWT + 1 INSERT)",
              "batch": "gateway, 8 calls/request"}
    print(f"\n{'medians of ' + str(len(rows['single'])) + ' rounds':<28} {'req/s':>8} "
          f"{'server µs/call':>15} {'postgres µs/call':>17} {'machine µs/call':>16} "
          f"{'server busy':>12} {'machine busy':>13}")
    for name, label in labels.items():
        print(f"{label:<28} {med(name, 0):8.0f} {med(name, 1):15.0f} {med(name, 2):17.0f} {med(name, 3):16.0f} "
              f"{med(name, 4):11.0%} {med(name, 5):12.0%}")
    print(f"\nratio gateway/baseline CPU per call, server:   {med('single', 1) / med('baseline', 1):.2f}")
    print(f"ratio gateway/baseline CPU per call, postgres: {med('single', 2) / med('baseline', 2):.2f}")
    print(f"ratio batch-8/single server CPU per call:      {med('batch', 1) / med('single', 1):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
