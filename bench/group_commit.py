"""Group commit, tuned: the tool-call path at 1, 8, 32 and 128 connections for several
settings of its statement lanes (``GATEWAY_DATABASE_GROUP_COMMIT_LANES``), when a further
lane may send (``GATEWAY_DATABASE_GROUP_COMMIT_OVERFLOW_AFTER_S``) and group size
(``GATEWAY_DATABASE_GROUP_COMMIT_MAX_REQUESTS``).

There is no time window to tune: the first lane sends what has queued as soon as it is free,
so a lone request goes at once and, under load, requests gather while the previous statement
is in flight. What can be tuned is how many statements may be in flight at once (lanes: more
overlap, smaller groups, more commits), how long the lanes before a further one must have
been busy before it sends (0: at once, as every lane did before overflow lanes) and how many
requests one statement may serve.

For each setting in turn (rounds alternate the settings' order), one gateway worker is
started on the bench database, warmed up, and driven with single-call requests at each
connection count; the script reads the worker's and PostgreSQL's CPU time around each run.
It prints, per setting and connection count, the medians of calls/s, p50 and p99, and the
gateway's and PostgreSQL's CPU per call, and the ratio of each setting's calls/s to the
default's (2 lanes, overflow after 5 ms, 64 requests) in the same rounds.

    .venv/bin/python bench/group_commit.py [--duration 4] [--repeats 3]

Needs wrk and a PostgreSQL server of its own (BENCH_DATABASE_URL), Linux (/proc).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench.cpu_per_call import postgres_cpu_s, postmaster_of, process_cpu_s  # noqa: E402

SETTINGS = ((2, 0.005, 64), (2, 0.0, 64), (1, 0.005, 64), (4, 0.005, 64), (2, 0.005, 16))
"""(lanes, overflow after s, max requests per statement); the first is the default the others
are compared to."""
CONNECTIONS = (1, 8, 32, 128)

Row = tuple[float, float, float, float, float]
"""calls/s, p50 ms, p99 ms, gateway µs/call, PostgreSQL µs/call"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Not the shared load options: this script sets the connection counts and runs itself.
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--log-level", default="INFO", help="the gateway's GATEWAY_LOG_LEVEL during the bench")
    args = parser.parse_args()
    if common.wrk_missing():
        return 2
    runs_needed = max(CONNECTIONS)
    results: dict[tuple[int, float, int, int], list[Row]] = {}
    with common.bench_database("gateway_group_commit") as db_dsn:
        env = common.gateway_env(db_dsn, log_level=args.log_level)
        common.prepare_gateway(env)
        postmaster = postmaster_of(db_dsn)
        token = common.member_token(env["GATEWAY_DATABASE_URL"])
        log = common.open_log()
        for repeat in range(args.repeats):
            order = SETTINGS if repeat % 2 == 0 else tuple(reversed(SETTINGS))
            for lanes, overflow_after_s, max_requests in order:
                port = common.free_port()
                url = f"http://127.0.0.1:{port}"
                gateway = common.start_gateway(port, {
                    **env,
                    "GATEWAY_DATABASE_GROUP_COMMIT_LANES": str(lanes),
                    "GATEWAY_DATABASE_GROUP_COMMIT_OVERFLOW_AFTER_S": str(overflow_after_s),
                    "GATEWAY_DATABASE_GROUP_COMMIT_MAX_REQUESTS": str(max_requests),
                }, log)
                try:
                    common.wait_until_up(url + "/healthz")
                    with common.gateway_client(url, token) as client:
                        runs = common.create_runs(client, runs_needed, max_tool_calls=1_000_000)

                    def drive(connections: int, label: str, duration: int) -> common.Sample:
                        return common.wrk(url, "tool_calls.lua", [token, common.fresh_prefix(label), "1", *runs],
                                          connections=connections, duration=duration)

                    drive(32, "w", 2)
                    for connections in CONNECTIONS:
                        gateway_before, postgres_before = process_cpu_s(gateway.pid), postgres_cpu_s(postmaster)
                        sample = drive(connections, "g", args.duration)
                        gateway_after, postgres_after = process_cpu_s(gateway.pid), postgres_cpu_s(postmaster)
                        calls = max(sample.requests, 1)
                        results.setdefault((lanes, overflow_after_s, max_requests, connections), []).append((
                            sample.rps, sample.p50_ms, sample.p99_ms,
                            1e6 * (gateway_after - gateway_before) / calls,
                            1e6 * (postgres_after - postgres_before) / calls,
                        ))
                        print(f"round {repeat + 1}: lanes {lanes}, overflow {overflow_after_s}, max {max_requests}, "
                              f"{connections:3} connections: "
                              f"{sample.rps:7.0f} calls/s, p50 {sample.p50_ms:6.1f} ms", file=sys.stderr)
                finally:
                    common.stop([gateway])
    report(results, args.repeats)
    return 0


def report(results: dict[tuple[int, float, int, int], list[Row]], repeats: int) -> None:
    def med(key: tuple[int, float, int, int], index: int) -> float:
        return statistics.median(row[index] for row in results[key])

    default = SETTINGS[0]
    print(f"\nmedians of {repeats} rounds; ratio = calls/s against lanes {default[0]}, "
          f"overflow after {default[1]} s, max {default[2]}")
    print(f"{'lanes':>5} {'overflow':>8} {'max':>4} {'conns':>5} {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'gw µs/call':>10} {'pg µs/call':>10} {'ratio':>6}")
    for lanes, overflow_after_s, max_requests in SETTINGS:
        for connections in CONNECTIONS:
            key = (lanes, overflow_after_s, max_requests, connections)
            ratio = statistics.median(
                mine[0] / base[0] for mine, base in zip(results[key], results[(*default, connections)], strict=True)
            )
            print(f"{lanes:5} {overflow_after_s:8} {max_requests:4} {connections:5} {med(key, 0):8.0f} "
                  f"{med(key, 1):7.1f} "
                  f"{med(key, 2):7.1f} {med(key, 3):10.0f} {med(key, 4):10.0f} {ratio:6.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
