"""Throughput of ``tools/call`` through ``/mcp`` against ``POST /v1/runs/{id}/tool-calls``.

Starts the gateway on PostgreSQL (``gateway serve``, one worker; bench/common.py starts the
bare baseline beside it, unused here), then drives, in alternating rounds at the same
concurrency, over the same runs:
- REST: one call per request, fresh tool_call ids and arguments (bench/tool_calls.lua)
- MCP: one ``tools/call`` per request on the 2026-07-28 wire, the run named in
  ``_meta["gateway/run_id"]``, fresh arguments (bench/mcp_tool_calls.lua)
and prints the medians of requests/s, p50 and p99, and MCP's throughput as a share of
REST's (the aim: >= 0.7).

    .venv/bin/python bench/mcp.py [--duration 4] [--repeats 5] [--connections 32]

Needs wrk and a PostgreSQL server (BENCH_DATABASE_URL, default
postgresql://postgres@127.0.0.1:5432/postgres); it creates and drops its own database.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench.common import Sample, median  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_load_options(parser, duration=4, repeats=5, connections=32)
    args = parser.parse_args()
    if common.wrk_missing():
        return 2

    with common.bench_database("gateway_bench_mcp") as db_dsn:
        processes: common.Processes = []
        try:
            servers = common.start_gateway_and_baseline(
                db_dsn, processes, log_level=args.log_level, runs=args.runs, max_tool_calls=10_000_000
            )
            url, token, runs = servers.gateway_url, servers.token, servers.runs

            def rest(label: str) -> Sample:
                return common.wrk(url, "tool_calls.lua", [token, common.fresh_prefix(label), "1", *runs],
                                  connections=args.connections, duration=args.duration)

            def mcp(label: str) -> Sample:
                return common.wrk(url, "mcp_tool_calls.lua", [token, common.fresh_prefix(label), *runs],
                                  connections=args.connections, duration=args.duration)

            check_mcp_call(url, token, runs[0])
            print(f"warming up ({args.connections} connections, {args.runs} runs) ...", file=sys.stderr)
            rest("w")
            mcp("w")
            rest_samples, mcp_samples = [], []
            for repeat in range(1, args.repeats + 1):
                first, second = (rest, mcp) if repeat % 2 else (mcp, rest)
                a, b = first("r"), second("r")
                rest_sample, mcp_sample = (a, b) if first is rest else (b, a)
                rest_samples.append(rest_sample)
                mcp_samples.append(mcp_sample)
                print(
                    f"round {repeat}: REST {rest_sample.rps:7.0f} req/s | MCP {mcp_sample.rps:7.0f} req/s",
                    file=sys.stderr,
                )
            report(rest_samples, mcp_samples)
            common.warn_on_errors(rest_samples + mcp_samples)
            return 0
        finally:
            common.stop(processes)


def check_mcp_call(url: str, token: str, run_id: str) -> None:
    """The load's request executes (a refusal would be a 200 too, and measure nothing)."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
            "gateway/run_id": run_id}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json", "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": "tools/call", "Mcp-Name": "add"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "add", "arguments": {"a": 1, "b": 2}, "_meta": meta}}
    answer = httpx.post(f"{url}/mcp", json=body, headers=headers, timeout=30).json()
    if answer.get("result", {}).get("structuredContent") != {"result": 3}:
        raise RuntimeError(f"the MCP call did not execute: {answer}")


def report(rest: list[Sample], mcp: list[Sample]) -> None:
    print(f"{'':34} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for label, samples in (("REST /v1/runs/{id}/tool-calls", rest), ("MCP tools/call at /mcp", mcp)):
        print(f"{label:34} {median(samples, 'rps'):8.0f} {median(samples, 'p50_ms'):8.2f} {median(samples, 'p99_ms'):8.2f}")
    ratio = median(mcp, "rps") / median(rest, "rps")
    print(f"MCP / REST throughput: {ratio:.2f} (aim: >= 0.7)")


if __name__ == "__main__":
    raise SystemExit(main())
