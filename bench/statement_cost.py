"""PostgreSQL's CPU time for the ledger's two grouped statements, by group size, against the
bare endpoint's one INSERT, measured in the same run.

On one connection to a migrated database, sends alternately:
- the baseline: bench/baseline_app.py's statement (one row into a table with no index but its
  key, committed durably);
- the admission of a group of n concurrent requests, one read-only tool call each (the
  statement the gateway sends before running an HTTP tool: claim, budget, repeat count),
  built by the gateway's own ledger code;
- the record of the same n calls (their outcomes and audit rows, committed durably);
- the same admission with every call sent as JSON (``gateway_admit_calls`` unpacking it, as
  the ledger sent it before the common case went as typed arrays), and its record;
and prints the server process's CPU time (/proc) per statement and per call for groups of 1, 4
and 16, and what a statement costs whatever its size (fixed) against what each call adds,
fitted over the smallest and largest groups.

The gateway groups the statements of concurrent requests (database.group_commit_*): how
many calls share one depends on the load, so PostgreSQL's CPU per call falls as
concurrency rises. This is the figure behind it, free of the HTTP servers and of the
machine's noise beyond PostgreSQL's own process.

    .venv/bin/python bench/statement_cost.py [--statements 1000] [--repeats 3] [--groups 1,4,16]
                                             [--calls-per-request 1] [--older-runs 0]

``--calls-per-request K`` gives every request K calls in its run (a batch); ``--older-runs N``
adds N older runs of the same user after the warm-up, as a user's history grows under a
connection that keeps its plans (the lookups of a run must not read them).

Linux only (/proc), and PostgreSQL on this machine (BENCH_DATABASE_URL, default
postgresql://postgres@127.0.0.1:5432/postgres); it creates and drops its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg  # noqa: E402

from bench import common  # noqa: E402
from bench.cpu_per_call import process_cpu_s  # noqa: E402
from gateway.auth.principal import Principal  # noqa: E402
from gateway.execution.checks import plan_call  # noqa: E402
from gateway.execution.ledger import FinishedCall, PostgresLedger, _AdmitItem, _RecordItem  # noqa: E402
from gateway.execution.protocol import ToolCallRequest  # noqa: E402
from gateway.execution.runner import OK  # noqa: E402
from gateway.tools.builtin import builtin_tools  # noqa: E402
from gateway.tools.registry import ToolRegistry  # noqa: E402

ALICE = Principal("acme", "alice", frozenset({"member"}), frozenset({"articles:read"}))
REGISTRY = ToolRegistry(builtin_tools())
BODY = '{"tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_article", "arguments": "{}"}}]}'


class Statements:
    """The ledger's two statements and the baseline's, on fresh calls each time (as a real load sends)."""

    def __init__(
        self, conn: asyncpg.Connection, ledger: PostgresLedger, runs: list[str], *, calls_per_request: int = 1
    ) -> None:
        self.conn, self.ledger, self.runs = conn, ledger, runs
        self.calls_per_request = calls_per_request

    def items(self, size: int) -> tuple[list[_AdmitItem], list[_RecordItem]]:
        now = datetime.now(UTC)
        admit, record = [], []
        for run_id in self.runs[:size]:
            plans = []
            for _ in range(self.calls_per_request):
                call_id = uuid.uuid4().hex
                arguments = f'{{"article_id": "{call_id}"}}'.encode()
                plans.append(plan_call(REGISTRY, ALICE, ToolCallRequest(id=call_id, name="get_article",
                                                                        arguments=arguments)))
            admit.append(_AdmitItem(ALICE, run_id, plans, "req_bench", now, now - timedelta(minutes=20),
                                    now + timedelta(days=1), None))
            finished = [FinishedCall(plan, OK, '{"ok":true,"result":{"title":"t"}}', 11.5) for plan in plans]
            record.append(_RecordItem(ALICE, run_id, finished, "req_bench", now))
        return admit, record

    async def admit(self, items: list[_AdmitItem], *, as_json: bool = False) -> None:
        ledger = self.ledger
        if as_json:  # everything as JSON, unpacked by gateway_admit_calls (as before migration 0019)
            ledger = PostgresLedger.__new__(PostgresLedger)
            ledger.sends_common_case_as_arrays = False
        admissions = await ledger._admit_many(self.conn, items)
        if any(a is None or a[0].decision != "execute" for a in admissions):
            raise RuntimeError(f"a call was not admitted to run: {admissions}")

    async def record(self, items: list[_RecordItem]) -> None:
        await self.ledger._record_many(self.conn, items)

    async def baseline(self) -> None:
        await self.conn.execute(common.BASELINE_INSERT, "acme", "alice", BODY)


async def cpu_us_per_statement(pid: int, statements: int, send: Callable[[], Awaitable[None]]) -> float:
    before = process_cpu_s(pid)
    for _ in range(statements):
        await send()
    return 1e6 * (process_cpu_s(pid) - before) / statements


async def measure(
    dsn: str, groups: list[int], statements: int, repeats: int, *, calls_per_request: int = 1, older_runs: int = 0
) -> dict[str, list[float]]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(common.BASELINE_TABLE)
        pid = int(await conn.fetchval("SELECT pg_backend_pid()"))
        runs = sorted(f"run_{uuid.uuid4().hex}" for _ in range(max(groups)))
        await conn.executemany(
            "INSERT INTO runs (id, tenant_id, user_id, max_tool_calls, max_repeats, created_at) "
            "VALUES ($1, 'acme', 'alice', 100000000, 3, now())",
            [(run,) for run in runs],
        )
        ledger = PostgresLedger.__new__(PostgresLedger)  # only its statements: no batchers, no pool
        subject = Statements(conn, ledger, runs, calls_per_request=calls_per_request)
        figures: dict[str, list[float]] = {}

        async def admit_and_record(size: int) -> tuple[float, float, float]:
            admit_us = json_us = record_us = 0.0
            for _ in range(statements):
                for as_json in (False, True):
                    admit, record = subject.items(size)
                    before = process_cpu_s(pid)
                    await subject.admit(admit, as_json=as_json)
                    middle = process_cpu_s(pid)
                    await subject.record(record)
                    if as_json:
                        json_us += middle - before
                    else:
                        admit_us += middle - before
                        record_us += process_cpu_s(pid) - middle
            return 1e6 * admit_us / statements, 1e6 * json_us / statements, 1e6 * record_us / statements

        for size in groups:  # warm up: plans made, caches filled
            for _ in range(50):
                admit, record = subject.items(size)
                await subject.admit(admit)
                await subject.record(record)
        if older_runs:  # the user's history grows while the connection keeps the plans made above
            await conn.executemany(
                "INSERT INTO runs (id, tenant_id, user_id, max_tool_calls, max_repeats, created_at) "
                "VALUES ($1, 'acme', 'alice', 10, 3, now() - interval '30 days')",
                [(f"run_old_{uuid.uuid4().hex}",) for _ in range(older_runs)],
            )
        for repeat in range(1, repeats + 1):
            figures.setdefault("baseline", []).append(await cpu_us_per_statement(pid, statements, subject.baseline))
            for size in groups:
                admit_us, json_us, record_us = await admit_and_record(size)
                figures.setdefault(f"admit {size}", []).append(admit_us)
                figures.setdefault(f"admit-json {size}", []).append(json_us)
                figures.setdefault(f"record {size}", []).append(record_us)
            print(f"round {repeat}: " + ", ".join(f"{k} {v[-1]:.0f} µs" for k, v in figures.items()), file=sys.stderr)
        return figures
    finally:
        await conn.close()


def report(figures: dict[str, list[float]], groups: list[int], calls_per_request: int = 1) -> None:
    def med(name: str) -> float:
        return statistics.median(figures[name])

    baseline = med("baseline")
    print(f"\n{'PostgreSQL CPU, medians':<32} {'µs/statement':>13} {'µs/call':>9} {'x baseline':>11}")
    print(f"{'baseline INSERT (1 row)':<32} {baseline:13.0f} {baseline:9.0f} {1:11.2f}")
    names = {"admit": "admission", "admit-json": "admission as JSON", "record": "record"}
    for kind, name in names.items():
        for size in groups:
            per_statement = med(f"{kind} {size}")
            calls = size * calls_per_request
            label = f"{name} of {calls} call{'s' if calls > 1 else ''}"
            per_call = per_statement / calls
            print(f"{label:<32} {per_statement:13.0f} {per_call:9.0f} {per_call / baseline:11.2f}")
    if len(groups) > 1:
        small, large = min(groups), max(groups)
        for kind, label in names.items():
            per_call = (med(f"{kind} {large}") - med(f"{kind} {small}")) / ((large - small) * calls_per_request)
            fixed = med(f"{kind} {small}") - small * calls_per_request * per_call
            print(f"{label}: {fixed:.0f} µs per statement + {per_call:.0f} µs per call "
                  f"(fitted over groups of {small} and {large} requests)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--statements", type=int, default=1000, help="statements of each kind per round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", default="1,4,16", help="group sizes (concurrent requests in one statement)")
    parser.add_argument("--calls-per-request", type=int, default=1, help="tool calls in each request (a batch)")
    parser.add_argument("--older-runs", type=int, default=0,
                        help="older runs of the same user added after the warm-up, while the connection keeps its plans")
    args = parser.parse_args()
    groups = sorted({int(size) for size in args.groups.split(",")})
    with common.bench_database("gateway_statements") as db_dsn:
        common.prepare_gateway(common.gateway_env(db_dsn, log_level="WARNING"))
        figures = asyncio.run(measure(db_dsn, groups, args.statements, args.repeats,
                                      calls_per_request=args.calls_per_request, older_runs=args.older_runs))
    report(figures, groups, args.calls_per_request)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
