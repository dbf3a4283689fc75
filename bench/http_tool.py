"""The cost of an HTTP tool call through the gateway against calling the service directly,
measured in the same run.

Starts, on the same server stack (uvicorn, uvloop, httptools, one worker each):
- the gateway (`gateway serve`) on PostgreSQL, with a tools file declaring one HTTP tool,
  `lookup` (GET /api/echo/{value} on the business service);
- the business service of the test suite (tests/support/business_service.py), which
  verifies the gateway's token with the gateway's JWKS on every request.

Then drives, alternately and at the same concurrency with wrk:
- (a) the tool through the gateway: `POST /v1/runs/{run}/tool-calls` with one call, a fresh
  tool_call id and a fresh argument on every request, spread over 32 runs (the guarded path:
  JWT, checks, ledger, a signed service token, the service call, the recorded outcome);
- (b) the service directly: the same `GET /api/echo/<fresh value>` with a gateway-signed token;
and prints the medians of requests/s, p50 and p99, the gateway/direct ratios and the gateway's
CPU time per HTTP tool call (the figure to compare versions by on a shared machine).
Targets, for a service doing 10 ms of work: the gateway's p50 within 1.3x of the direct call's at
4 connections, within 2x at 32 on one worker. ``--service-work-ms N`` makes the
service spend N ms on each request, as a real one would (a query, its own calls): the ratio
depends on it, since the gateway adds a roughly fixed cost per call. With ``--builtin`` it also
drives (c) the built-in ``add`` tool through the gateway, to tell the gateway's own cost
per call (JWT, guards, ledger) from what the HTTP tool adds to it.

    .venv/bin/python bench/http_tool.py [--duration 5] [--repeats 3] [--connections 32] [--builtin]
                                        [--service-work-ms 0]

Needs wrk (`apt-get install wrk`) and a PostgreSQL server (BENCH_DATABASE_URL, default
postgresql://postgres@127.0.0.1:5432/postgres); it creates and drops its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench.cpu_per_call import postgres_cpu_s, postmaster_of, process_cpu_s  # noqa: E402
from bench.common import Sample, median  # noqa: E402
from gateway.auth.principal import Principal  # noqa: E402
from gateway.auth.service_tokens import ServiceTokenSigner, generate_signing_key_pem  # noqa: E402
from gateway.db.engine import Database  # noqa: E402
from gateway.db.tenants import ensure_role  # noqa: E402
from gateway.settings import Settings  # noqa: E402

TOOLS_TOML = """
[services.orders]
base_url = "http://127.0.0.1:{port}/api"
error_message_field = "detail"

[[tools]]
name = "lookup"
description = "Look a value up in the orders service."
service = "orders"
permission = "orders:read"
request = {{ method = "GET", path = "/echo/{{value}}" }}
arguments = {{ type = "object", required = ["value"], properties = {{ value = {{ type = "string", maxLength = 100 }} }} }}
"""


async def grant_orders_read(database_url: str) -> None:
    db = Database.from_settings(Settings.from_flat(database_url=database_url))
    try:
        async with db.begin() as conn:
            await ensure_role(conn, tenant_id="acme", name="member", description="member",
                              permissions=frozenset({"orders:read"}))
    finally:
        await db.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_load_options(parser, duration=5, repeats=3, connections=32)
    parser.add_argument("--builtin", action="store_true", help="also drive the built-in `add` tool (reference)")
    parser.add_argument("--service-work-ms", type=int, default=0,
                        help="how long the service works on each request before answering (its own latency)")
    args = parser.parse_args()
    if common.wrk_missing():
        return 2

    with (
        common.bench_database("gateway_bench_http") as db_dsn,
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as work,
    ):
        processes: common.Processes = []
        try:
            gateway_port, service_port = common.free_port(), common.free_port()
            key_path = Path(work) / "signing.pem"
            key_path.write_bytes(generate_signing_key_pem())
            tools_path = Path(work) / "tools.toml"
            tools_path.write_text(TOOLS_TOML.format(port=service_port))
            env = common.gateway_env(
                db_dsn,
                log_level=args.log_level,
                GATEWAY_TOOLS_FILE=str(tools_path),
                GATEWAY_SERVICE_SIGNING_KEY_FILE=str(key_path),
                GATEWAY_SERVICE_TOKEN_TTL_S="3600",
                BUSINESS_JWKS_URL=f"http://127.0.0.1:{gateway_port}/.well-known/jwks.json",
                BUSINESS_ECHO_WORK_MS=str(args.service_work_ms),
            )
            database_url = env["GATEWAY_DATABASE_URL"]
            common.prepare_gateway(env)
            asyncio.run(grant_orders_read(database_url))

            log = common.open_log()
            processes.append(common.start_gateway(gateway_port, env, log))
            service_app = "tests.support.business_service:app_from_env"
            processes.append(common.start_uvicorn(service_app, service_port, env, log, "--factory"))
            gateway_url = f"http://127.0.0.1:{gateway_port}"
            service_url = f"http://127.0.0.1:{service_port}"
            common.wait_until_up(gateway_url + "/healthz")
            common.wait_until_up(service_url + "/api/whoami")

            token = common.member_token(database_url)
            # The direct side sends what the gateway would: a token it signed for the service.
            signer = ServiceTokenSigner.from_pem(key_path.read_bytes(), issuer="gateway", ttl_s=3600)
            alice = Principal(tenant_id="acme", user_id="alice", roles=frozenset({"member"}), permissions=frozenset())
            service_token = signer.sign(alice, audience="orders", run_id="bench", tool_call_id="bench")
            with common.gateway_client(gateway_url, token) as client:
                runs = common.create_runs(client, args.runs, max_tool_calls=100_000)
                arguments = '{"value": "v"}'
                call = {"id": "check", "type": "function", "function": {"name": "lookup", "arguments": arguments}}
                check = client.post(f"/v1/runs/{runs[0]}/tool-calls", json={"tool_calls": [call]})
                if '\\"ok\\":true' not in check.text:
                    raise RuntimeError(f"the HTTP tool does not answer ok: {check.text}")

            postmaster = postmaster_of(db_dsn)
            # µs of CPU per request, by process: where the machine's two cores go.
            cpu_us: dict[str, list[float]] = {"gateway": [], "postgres": [], "service": [], "service direct": []}
            stages = common.StageTimes(gateway_url)

            def through_gateway(label: str) -> Sample:
                gateway_before, service_before = process_cpu_s(processes[0].pid), process_cpu_s(processes[1].pid)
                postgres_before = postgres_cpu_s(postmaster)
                stages.mark()
                sample = common.wrk(gateway_url, "http_tool_calls.lua", [token, common.fresh_prefix(label), *runs],
                                    connections=args.connections, duration=args.duration)
                if sample.requests:
                    per_request = 1e6 / sample.requests
                    cpu_us["gateway"].append(per_request * (process_cpu_s(processes[0].pid) - gateway_before))
                    cpu_us["service"].append(per_request * (process_cpu_s(processes[1].pid) - service_before))
                    cpu_us["postgres"].append(per_request * (postgres_cpu_s(postmaster) - postgres_before))
                stages.add()
                return sample

            def direct(label: str) -> Sample:
                before = process_cpu_s(processes[1].pid)
                sample = common.wrk(service_url, "service_direct.lua", [service_token, common.fresh_prefix(label)],
                                    connections=args.connections, duration=args.duration)
                if sample.requests:
                    cpu_us["service direct"].append(1e6 * (process_cpu_s(processes[1].pid) - before) / sample.requests)
                return sample

            def builtin(label: str) -> Sample:
                return common.wrk(gateway_url, "tool_calls.lua", [token, common.fresh_prefix(label), "1", *runs],
                                  connections=args.connections, duration=args.duration)

            print(f"warming up ({args.connections} connections, {args.runs} runs) ...", file=sys.stderr)
            through_gateway("w")
            direct("w")

            for figures in cpu_us.values():
                figures.clear()  # the warm-up's
            stages.reset()
            via, straight, reference = [], [], []
            for repeat in range(1, args.repeats + 1):
                via.append(through_gateway("g"))
                straight.append(direct("d"))
                line = (f"round {repeat}: via gateway {via[-1].rps:7.0f} req/s p50 {via[-1].p50_ms:6.2f} ms | "
                        f"direct {straight[-1].rps:7.0f} req/s p50 {straight[-1].p50_ms:6.2f} ms")
                if args.builtin:
                    reference.append(builtin("b"))
                    line += f" | built-in add {reference[-1].rps:7.0f} req/s p50 {reference[-1].p50_ms:6.2f} ms"
                print(line, file=sys.stderr)
            report(via, straight, reference)
            if cpu_us["gateway"]:
                print(f"gateway CPU per HTTP tool call:  {statistics.median(cpu_us['gateway']):.0f} µs "
                      "(the serving process's user + system time over the requests wrk completed)")
                print("CPU per request, µs: " + ", ".join(
                    f"{name} {statistics.median(figures):.0f}" for name, figures in cpu_us.items() if figures
                ) + " (the PostgreSQL server's processes; the service's through the gateway and called directly)")
            print(f"HTTP tool through the gateway, {stages.line()}")
            common.warn_on_errors(via + straight + reference)
            return 0
        finally:
            common.stop(processes)


def report(via: list[Sample], straight: list[Sample], reference: list[Sample]) -> None:
    print(f"\n{'medians of ' + str(len(via)) + ' rounds':<34} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    rows = [("HTTP tool through the gateway", via), ("service called directly", straight)]
    if reference:
        rows.append(("built-in add through the gateway", reference))
    for label, samples in rows:
        print(f"{label:<34} {median(samples, 'rps'):9.0f} {median(samples, 'p50_ms'):8.2f} "
              f"{median(samples, 'p99_ms'):8.2f}")
    print(f"\nratio gateway/direct p50:        {median(via, 'p50_ms') / median(straight, 'p50_ms'):.2f}  "
          "(targets, 10 ms of service work: <= 1.30 at 4 connections, <= 2.00 at 32)")
    print(f"ratio gateway/direct p99:        {median(via, 'p99_ms') / median(straight, 'p99_ms'):.2f}")
    print(f"ratio gateway/direct throughput: {median(via, 'rps') / median(straight, 'rps'):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
