"""The cost of an MCP tool call through the gateway against calling the MCP server directly
with the SDK's client, measured in the same run.

Starts, on the same server stack (uvicorn, uvloop, httptools, one worker each):
- the gateway (`gateway serve`) on PostgreSQL, with a tools file putting one MCP server
  behind the guard and including its tool `work` (read-only);
- that MCP server (tests/support/mcp_upstream.py, built with the SDK's ``MCPServer``,
  streamable HTTP), whose `work` waits ``--work-ms`` (default 10 ms) and answers.

Then drives, alternately, ``--clients`` (default 4) concurrent clients for ``--duration`` s:
- (a) through the gateway: `POST /v1/runs/{run}/tool-calls` with one call of `work`, a
  fresh tool_call id and a fresh argument every time (the guarded path: JWT, checks, ledger,
  a signed identity token, the MCP call, the recorded outcome);
- (b) directly: the SDK's ``ClientSession.call_tool("work", ...)`` on one session, with a
  gateway-signed token, as the gateway's own session does;
and prints the medians over ``--repeats`` rounds of calls/s and p50/p99, and the ratios.
Target: the gateway's p50 within 1.3x of the direct call's.

    .venv/bin/python bench/mcp_federation.py [--duration 5] [--repeats 3] [--clients 4] [--work-ms 10]

Needs a PostgreSQL server (BENCH_DATABASE_URL, default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import httpx2  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from bench import common  # noqa: E402
from gateway.auth.principal import Principal  # noqa: E402
from gateway.auth.service_tokens import ServiceTokenSigner, generate_signing_key_pem  # noqa: E402
from gateway.db.engine import Database  # noqa: E402
from gateway.db.tenants import ensure_role  # noqa: E402
from gateway.settings import Settings  # noqa: E402

TOOLS_TOML = """
[mcp_servers.bench]
url = "http://127.0.0.1:{port}/mcp"
include = ["work"]

[mcp_servers.bench.tools.work]
permission = "bench:read"
"""


@dataclass
class Sample:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


async def grant(database_url: str) -> None:
    db = Database.from_settings(Settings.from_flat(database_url=database_url))
    try:
        async with db.begin() as conn:
            await ensure_role(conn, tenant_id="acme", name="member", description="member",
                              permissions=frozenset({"bench:read"}))
    finally:
        await db.dispose()


_calls = itertools.count()
"""Numbers every call of the whole run, so that no tool_call id is ever sent twice (a repeated
id is answered from the stored outcome, without calling the server)."""


async def drive(call: Callable[[int], Awaitable[bool]], *, clients: int, duration: float) -> Sample:
    """``clients`` loops calling ``call`` back to back for ``duration`` seconds."""
    latencies: list[float] = []
    errors = 0
    counter = _calls
    deadline = time.perf_counter() + duration

    async def client() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            ok = await call(next(counter))
            latencies.append(time.perf_counter() - started)
            errors += 0 if ok else 1

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies)
    return Sample(
        rps=len(latencies) / elapsed,
        p50_ms=1000 * statistics.median(ordered),
        p99_ms=1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        errors=errors,
    )


async def measure(args: argparse.Namespace, gateway_url: str, mcp_url: str, token: str, runs: list[str],
                  upstream_token: str) -> tuple[list[Sample], list[Sample]]:
    prefix = uuid.uuid4().hex[:6]
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with (
        httpx.AsyncClient(base_url=gateway_url, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                          timeout=30) as gateway,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {upstream_token}"}, timeout=30) as direct_http,
        streamable_http_client(mcp_url, http_client=direct_http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()

        async def via_gateway(n: int) -> bool:
            call = {"id": f"c{prefix}{n}", "type": "function",
                    "function": {"name": "work", "arguments": f'{{"ms": {args.work_ms}, "tag": "g{n}"}}'}}
            response = await gateway.post(f"/v1/runs/{runs[n % len(runs)]}/tool-calls", json={"tool_calls": [call]})
            return response.status_code == 200 and '\\"ok\\":true' in response.text

        async def directly(n: int) -> bool:
            result = await session.call_tool("work", {"ms": args.work_ms, "tag": f"d{n}"})
            return not result.is_error

        if not await via_gateway(-1) or not await directly(-1):
            raise RuntimeError("the tool does not answer ok (see bench/last-run.log)")
        print(f"warming up ({args.clients} clients) ...", file=sys.stderr)
        await drive(via_gateway, clients=args.clients, duration=1)
        await drive(directly, clients=args.clients, duration=1)
        via, straight = [], []
        for repeat in range(1, args.repeats + 1):
            via.append(await drive(via_gateway, clients=args.clients, duration=args.duration))
            straight.append(await drive(directly, clients=args.clients, duration=args.duration))
            print(f"round {repeat}: via gateway {via[-1].rps:6.0f} calls/s p50 {via[-1].p50_ms:6.2f} ms | "
                  f"direct {straight[-1].rps:6.0f} calls/s p50 {straight[-1].p50_ms:6.2f} ms", file=sys.stderr)
        return via, straight


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--work-ms", type=int, default=10)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()

    with (
        common.bench_database("gateway_bench_mcp") as db_dsn,
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as work,
    ):
        processes: common.Processes = []
        try:
            gateway_port, mcp_port = common.free_port(), common.free_port()
            key_path = Path(work) / "signing.pem"
            key_path.write_bytes(generate_signing_key_pem())
            tools_path = Path(work) / "tools.toml"
            tools_path.write_text(TOOLS_TOML.format(port=mcp_port))
            env = common.gateway_env(
                db_dsn,
                log_level=args.log_level,
                # This checkout's code, whichever `gateway` is on PATH.
                PYTHONPATH=str(common.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
                GATEWAY_TOOLS_FILE=str(tools_path),
                GATEWAY_SERVICE_SIGNING_KEY_FILE=str(key_path),
                GATEWAY_SERVICE_TOKEN_TTL_S="3600",
                MCP_UPSTREAM_JWKS_URL=f"http://127.0.0.1:{gateway_port}/.well-known/jwks.json",
            )
            database_url = env["GATEWAY_DATABASE_URL"]
            common.prepare_gateway(env)
            asyncio.run(grant(database_url))

            log = common.open_log()
            processes.append(common.start_uvicorn("tests.support.mcp_upstream:app_from_env", mcp_port, env, log,
                                                  "--factory"))
            mcp_url = f"http://127.0.0.1:{mcp_port}/mcp"
            common.wait_until_up(f"http://127.0.0.1:{mcp_port}/")
            processes.append(common.start_gateway(gateway_port, env, log))
            gateway_url = f"http://127.0.0.1:{gateway_port}"
            common.wait_until_up(gateway_url + "/healthz")

            token = common.member_token(database_url)
            signer = ServiceTokenSigner.from_pem(key_path.read_bytes(), issuer="gateway", ttl_s=3600)
            alice = Principal(tenant_id="acme", user_id="alice", roles=frozenset({"member"}), permissions=frozenset())
            upstream_token = signer.sign(alice, audience="bench", run_id="bench", tool_call_id="bench")
            with common.gateway_client(gateway_url, token) as client:
                runs = common.create_runs(client, args.runs, max_tool_calls=1_000_000)
            via, straight = asyncio.run(measure(args, gateway_url, mcp_url, token, runs, upstream_token))
            report(via, straight, args)
            if sum(s.errors for s in via + straight):
                print("WARNING: some calls failed; see bench/last-run.log", file=sys.stderr)
            return 0
        finally:
            common.stop(processes)


def report(via: list[Sample], straight: list[Sample], args: argparse.Namespace) -> None:
    def med(samples: list[Sample], attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in samples)

    print(f"\n{args.clients} clients, upstream work {args.work_ms} ms, medians of {len(via)} rounds of "
          f"{args.duration:g} s")
    print(f"{'':<34} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for label, samples in (("MCP tool through the gateway", via), ("MCP server directly (SDK)", straight)):
        print(f"{label:<34} {med(samples, 'rps'):9.0f} {med(samples, 'p50_ms'):8.2f} {med(samples, 'p99_ms'):8.2f}")
    print(f"\nratio gateway/direct p50:        {med(via, 'p50_ms') / med(straight, 'p50_ms'):.2f}  (target <= 1.30)")
    print(f"ratio gateway/direct p99:        {med(via, 'p99_ms') / med(straight, 'p99_ms'):.2f}")
    print(f"ratio gateway/direct throughput: {med(via, 'rps') / med(straight, 'rps'):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
