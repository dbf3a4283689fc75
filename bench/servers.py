"""Two ASGI servers under the same apps: granian (Rust) against uvicorn (uvloop, httptools),
one worker each, on the gateway's hot path and on the bare baseline endpoint.

Starts four servers on one bench database (PostgreSQL):
- the gateway under uvicorn, as `gateway serve` runs it (uvloop, httptools, no access log),
- the gateway under granian: `granian --interface asgi --factory
  gateway.asgi:create_app_from_env --workers 1 --loop uvloop --http 1 --no-ws`,
- bench/baseline_app.py (JWT + one raw asyncpg INSERT) under each of the two,
then drives them in turn with wrk (each server first in every other round), `--repeats` rounds, one call per request with fresh
tool_call ids and arguments spread over 32 runs. For each it prints the median of req/s,
p50 and p99, the CPU its processes spent per request (the server and its worker processes,
read from /proc: the figure that drifts least on a shared machine) and the ratios
granian/uvicorn, as medians of per-round ratios (a round's samples are taken back to back).

    .venv/bin/python bench/servers.py [--duration 5] [--repeats 3] [--connections 32]
    .venv/bin/python bench/servers.py --duration 1 --repeats 1    # smoke run

Needs granian (`pip install -e '.[bench]'`), wrk and a PostgreSQL server
(BENCH_DATABASE_URL, default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, pinning  # noqa: E402
from bench.cpu_per_call import process_cpu_s  # noqa: E402


def granian_command() -> str | None:
    local = Path(sys.executable).parent / "granian"
    return str(local) if local.exists() else shutil.which("granian")


def start_granian(
    app: str, port: int, env: Mapping[str, str], log: IO[bytes], *options: str
) -> subprocess.Popen[bytes]:
    """An app of this repository under granian, set up like `gateway serve` sets up uvicorn."""
    command = granian_command()
    assert command is not None
    return subprocess.Popen(
        [command, "--interface", "asgi", *options, "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-ws", "--no-access-log",
         "--log-level", "warning", app],
        env=env, cwd=common.ROOT, stdout=log, stderr=log,
    )


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process and of every process below it (granian serves from a child)."""
    return sum(process_cpu_s(pid) for pid in pinning.tree(root))


@dataclass
class Target:
    label: str
    url: str
    pid: int
    samples: list[common.Sample] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_load_options(parser, duration=5, repeats=3, connections=32)
    args = parser.parse_args()
    if common.wrk_missing():
        return 2
    if granian_command() is None:
        print("bench: granian is needed (pip install -e '.[bench]')", file=sys.stderr)
        return 2

    with common.bench_database("gateway_srv") as db_dsn, common.open_log() as log:
        env = common.gateway_env(db_dsn, log_level=args.log_level, BENCH_BASELINE_DSN=db_dsn)
        common.prepare_gateway(env)
        ports = [common.free_port() for _ in range(4)]
        processes: common.Processes = [
            common.start_gateway(ports[0], env, log, "--no-migrate"),
            start_granian("gateway.asgi:create_app_from_env", ports[1], env, log, "--factory"),
            common.start_uvicorn("bench.baseline_app:app", ports[2], env, log),
            start_granian("bench.baseline_app:app", ports[3], env, log),
        ]
        try:
            labels = ("gateway, uvicorn", "gateway, granian", "baseline, uvicorn", "baseline, granian")
            targets = [
                Target(label, f"http://127.0.0.1:{port}", process.pid)
                for label, port, process in zip(labels, ports, processes, strict=True)
            ]
            for target, path in zip(targets, ("/readyz", "/readyz", "/", "/"), strict=True):
                common.wait_until_up(target.url + path, timeout=60)
            token = common.member_token(env["GATEWAY_DATABASE_URL"])
            with common.gateway_client(targets[0].url, token) as client:
                runs = common.create_runs(client, args.runs, max_tool_calls=10_000_000)

            def drive(target: Target, label: str, duration: int) -> common.Sample:
                return common.wrk(target.url, "tool_calls.lua", [token, common.fresh_prefix(label), "1", *runs],
                                  connections=args.connections, duration=duration)

            print(f"warming up ({args.connections} connections) ...", file=sys.stderr)
            for target in targets:
                drive(target, "w", 2)
            for repeat in range(1, args.repeats + 1):
                # Each server goes first in every other round, so that neither always meets
                # the machine just after the other has warmed it (or the test suite has).
                order = targets if repeat % 2 else [targets[1], targets[0], targets[3], targets[2]]
                for target in order:
                    before = tree_cpu_s(target.pid)
                    sample = drive(target, "r", args.duration)
                    target.cpu_us.append(1e6 * (tree_cpu_s(target.pid) - before) / max(1, sample.requests))
                    target.samples.append(sample)
                print(f"round {repeat}: " + " | ".join(f"{t.label} {t.samples[-1].rps:6.0f}/s" for t in targets),
                      file=sys.stderr)
            report(targets, args.connections)
            common.warn_on_errors(s for t in targets for s in t.samples)
            return 0
        finally:
            common.stop(processes)


def report(targets: list[Target], connections: int) -> None:
    print(f"\none worker each, 1 call/request, {connections} connections; medians of {len(targets[0].samples)} rounds")
    print(f"{'':<20} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU µs/req':>11}")
    for t in targets:
        print(f"{t.label:<20} {common.median(t.samples, 'rps'):8.0f} {common.median(t.samples, 'p50_ms'):8.2f} "
              f"{common.median(t.samples, 'p99_ms'):8.2f} {statistics.median(t.cpu_us):11.0f}")
    print("\ngranian/uvicorn, medians of per-round ratios:")
    for name, (uvicorn, granian) in (("gateway", targets[0:2]), ("baseline", targets[2:4])):
        rps = statistics.median(g.rps / u.rps for u, g in zip(uvicorn.samples, granian.samples, strict=True))
        cpu = statistics.median(g / u for u, g in zip(uvicorn.cpu_us, granian.cpu_us, strict=True))
        print(f"  {name:<9} throughput {rps:.2f}   server CPU per request {cpu:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
