"""Throughput of the guarded hot path against a bare baseline, measured in the same run.

Starts, on PostgreSQL and on the same server stack (uvicorn, uvloop, httptools, one
worker each):
- the gateway (`gateway serve`), and
- bench/baseline_app.py: a bare Litestar endpoint that decodes the JWT and inserts one
  row with raw asyncpg.

Then drives them alternately with wrk at the same concurrency, every request carrying
fresh tool_call ids and fresh arguments, spread over 32 runs:
- gateway, one call per request      (compared with the baseline: target >= 1.0, aim 1.2)
- baseline, one insert per request
- gateway, a batch of 8 calls        (calls/s compared with single calls: target >= 4x)
three times, and prints the medians of requests/s, p50 and p99 and their ratios.

    .venv/bin/python bench/hot_path.py [--duration 5] [--repeats 3] [--connections 32]

Needs wrk (`apt-get install wrk`) and a PostgreSQL server (BENCH_DATABASE_URL, default
postgresql://postgres@127.0.0.1:5432/postgres); it creates and drops its own database.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench.common import Sample, median  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_load_options(parser, duration=4, repeats=5, connections=32)
    args = parser.parse_args()
    if common.wrk_missing():
        return 2

    with common.bench_database("gateway_bench") as db_dsn:
        processes: common.Processes = []
        try:
            servers = common.start_gateway_and_baseline(
                db_dsn, processes, log_level=args.log_level, runs=args.runs, max_tool_calls=100_000
            )
            gateway_url, baseline_url, token, runs = servers.gateway_url, servers.baseline_url, servers.token, servers.runs

            stages = {1: common.StageTimes(gateway_url), 8: common.StageTimes(gateway_url)}

            def drive(url: str, batch: int, label: str) -> Sample:
                timed = stages[batch] if url == gateway_url else None
                if timed is not None:
                    timed.mark()
                sample = common.wrk(url, "tool_calls.lua", [token, common.fresh_prefix(label), str(batch), *runs],
                                    connections=args.connections, duration=args.duration)
                if timed is not None:
                    timed.add()
                return sample

            print(f"warming up ({args.connections} connections, {args.runs} runs) ...", file=sys.stderr)
            drive(gateway_url, 1, "w")
            drive(baseline_url, 1, "w")
            drive(gateway_url, 8, "w")

            for timed in stages.values():
                timed.reset()  # the warm-up's
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
            print(f"\ngateway, 1 call/request:  {stages[1].line()}")
            print(f"gateway, 8 calls/request: {stages[8].line()}")
            common.warn_on_errors(single + base + batch)
            return 0
        finally:
            common.stop(processes)


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
    print(f"\nratio gateway/baseline throughput: {single_rps / base_rps:.2f}  (target >= 1.00, aim 1.20)")
    print(f"ratio gateway/baseline p50:        {median(single, 'p50_ms') / median(base, 'p50_ms'):.2f}")
    print(f"ratio gateway/baseline p99:        {median(single, 'p99_ms') / median(base, 'p99_ms'):.2f}")
    print(f"ratio batch-8/single calls per s:  {batch_calls / single_rps:.2f}  (target >= 4.00)")
    # The machine's speed drifts over a run; a round's samples are taken back to back, so the
    # ratio within each round cancels most of the drift. Their median is the steadier figure.
    paired = statistics.median(s.rps / b.rps for s, b in zip(single, base, strict=True))
    paired_batch = statistics.median(m.rps * 8 / s.rps for s, m in zip(single, batch, strict=True))
    print(f"\nmedian of per-round ratios: gateway/baseline {paired:.2f}, batch-8/single {paired_batch:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
