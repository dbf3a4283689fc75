"""Budgets, replays and approvals stay exact under real concurrent requests against PostgreSQL:
a real uvicorn server on a loopback port, and several `gateway serve` processes sharing one
database. Loads are bounded (tens of requests) and every wait has a timeout."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager

import httpx
import pytest
import sqlalchemy as sa

from gateway.app import create_app
from gateway.db.models import Run
from tests.support import db
from tests.support.app import make_settings
from tests.support.calls import batch, outcome, tool_call
from tests.support.loopback import ServerThread
from tests.support.tokens import auth_for
from tests.support.tools import Probe, registry_with_probe

ALICE, BOB, CAROL = auth_for("alice"), auth_for("bob"), auth_for("carol")
CONCURRENT_REQUESTS = 50
BUDGET = 10
TIMEOUT = httpx.Timeout(60.0)


@contextmanager
def serving(database_url: str, probe: Probe) -> Iterator[str]:
    """The app with the probe's tools under a real uvicorn server; yields its base URL."""
    app = create_app(make_settings(database_url), registry=registry_with_probe(probe))
    with ServerThread(app) as server:
        yield server.url


@pytest.fixture
def server(seeded_pg_url: str, probe: Probe) -> Iterator[str]:
    with serving(seeded_pg_url, probe) as base_url:
        yield base_url


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=CONCURRENT_REQUESTS, max_keepalive_connections=CONCURRENT_REQUESTS)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
        yield client


async def new_run(http: httpx.AsyncClient, base_url: str, headers: dict[str, str], **limits: int) -> str:
    response = await http.post(f"{base_url}/v1/runs", json=limits, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def call_each(
    http: httpx.AsyncClient, base_urls: Sequence[str], run_id: str, calls: Sequence[dict], headers: dict[str, str]
) -> list[dict]:
    """Send every call as its own request, all at once, spread over the servers; return the contents."""
    servers = itertools.cycle(base_urls)

    async def one(call: dict, base_url: str) -> dict:
        response = await http.post(f"{base_url}/v1/runs/{run_id}/tool-calls", json=batch(call), headers=headers)
        assert response.status_code == 200, response.text
        return json.loads(response.json()["messages"][0]["content"])

    return list(await asyncio.gather(*(one(call, next(servers)) for call in calls)))


async def assert_exactly_budget_executed(url: str, run_id: str, contents: list[dict]) -> None:
    outcomes = Counter(outcome(c) for c in contents)
    assert outcomes == {"OK": BUDGET, "BUDGET_EXCEEDED": CONCURRENT_REQUESTS - BUDGET}, outcomes
    audit = Counter(r.outcome for r in await db.audit_rows(url, run_id=run_id))
    assert audit["OK"] == BUDGET and audit["BUDGET_EXCEEDED"] == CONCURRENT_REQUESTS - BUDGET
    (run,) = await db.rows(url, sa.select(Run.__table__).where(Run.__table__.c.id == run_id))
    assert run.used_tool_calls == BUDGET


# --- one server --------------------------------------------------------------------------


async def assert_concurrent_requests_stay_within_the_budget(
    http: httpx.AsyncClient, base_url: str, database_url: str, probe: Probe
) -> None:
    run_id = await new_run(http, base_url, ALICE, max_tool_calls=BUDGET)
    calls = [tool_call("count", {"text": str(i)}, call_id=f"c{i}") for i in range(CONCURRENT_REQUESTS)]
    contents = await call_each(http, [base_url], run_id, calls, ALICE)
    await assert_exactly_budget_executed(database_url, run_id, contents)
    assert sum(probe.executions.values()) == BUDGET


async def test_concurrent_requests_never_exceed_the_budget(server, http, probe, seeded_pg_url):
    await assert_concurrent_requests_stay_within_the_budget(http, server, seeded_pg_url, probe)


async def test_budgets_of_several_runs_stay_exact_when_their_calls_interleave(server, http, probe, seeded_pg_url):
    runs = [await new_run(http, server, ALICE, max_tool_calls=4) for _ in range(3)]

    async def flood(run_id: str) -> list[dict]:
        calls = [tool_call("count", {"text": f"{run_id}-{i}"}, call_id=f"c{i}") for i in range(12)]
        return await call_each(http, [server], run_id, calls, ALICE)

    results = await asyncio.gather(*(flood(run_id) for run_id in runs))
    for contents in results:
        assert Counter(outcome(c) for c in contents) == {"OK": 4, "BUDGET_EXCEEDED": 8}
    assert sum(probe.executions.values()) == 12


async def test_concurrent_retries_of_one_call_execute_it_once(server, http, probe):
    run_id = await new_run(http, server, ALICE)
    calls = [tool_call("count", {"text": "once"}, call_id="same-id")] * 20
    contents = await call_each(http, [server], run_id, calls, ALICE)
    assert probe.executions == {"same-id": 1}
    assert {outcome(c) for c in contents} <= {"OK", "TOOL_CALL_IN_PROGRESS"}
    assert Counter(outcome(c) for c in contents)["OK"] >= 1


async def test_concurrent_calls_under_one_id_run_exactly_one_and_conflict_the_rest(server, http, probe):
    run_id = await new_run(http, server, ALICE)
    calls = [tool_call("count", {"text": str(i)}, call_id="call_0") for i in range(20)]
    contents = await call_each(http, [server], run_id, calls, ALICE)
    assert Counter(outcome(c) for c in contents) == {"OK": 1, "TOOL_CALL_ID_CONFLICT": 19}
    assert probe.executions == {"call_0": 1}


async def test_two_concurrent_approvals_execute_the_call_once(server, http, probe):
    run_id = await new_run(http, server, BOB)
    for n in range(3):
        call = tool_call("write_note", {"text": str(n)}, call_id=f"w{n}")
        requested = (await call_each(http, [server], run_id, [call], BOB))[0]
        approval_id = requested["error"]["approval_id"]
        responses = await asyncio.gather(
            *(http.post(f"{server}/v1/admin/approvals/{approval_id}/approve", headers=CAROL) for _ in range(2))
        )
        assert sorted(r.status_code for r in responses) == [200, 409]
        refused = next(r for r in responses if r.status_code == 409)
        assert refused.json()["error"]["code"] == "ALREADY_DECIDED"
    assert probe.executions == {"w0": 1, "w1": 1, "w2": 1}


# --- several gateway processes -----------------------------------------------------------


async def test_the_budget_holds_across_gateway_processes(fleet, http, fleet_database):
    run_id = await new_run(http, fleet[0], ALICE, max_tool_calls=BUDGET)
    calls = [tool_call("add", {"a": i, "b": 1}, call_id=f"c{i}") for i in range(CONCURRENT_REQUESTS)]
    contents = await call_each(http, fleet, run_id, calls, ALICE)
    await assert_exactly_budget_executed(fleet_database, run_id, contents)


async def test_approving_from_several_processes_at_once_executes_once(fleet, http, fleet_database):
    run_id = await new_run(http, fleet[0], BOB)
    title = "Written exactly once"
    call = tool_call("create_article", {"title": title, "body": "Approved from every process."}, call_id="w1")
    (requested,) = await call_each(http, fleet[:1], run_id, [call], BOB)
    approval_id = requested["error"]["approval_id"]
    responses = await asyncio.gather(
        *(http.post(f"{url}/v1/admin/approvals/{approval_id}/approve", headers=CAROL) for url in fleet * 2)
    )
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: 1, 409: len(fleet) * 2 - 1}, statuses
    assert len(await db.articles(fleet_database, title=title)) == 1
    executed = await db.audit_rows(fleet_database, approval_id=approval_id, kind="tool_call", outcome="OK")
    assert len(executed) == 1


async def test_retries_of_one_call_across_processes_execute_it_once(fleet, http, fleet_database):
    run_id = await new_run(http, fleet[0], ALICE)
    calls = [tool_call("add", {"a": 2, "b": 3}, call_id="same-id")] * 12
    contents = await call_each(http, fleet, run_id, calls, ALICE)
    assert {outcome(c) for c in contents} <= {"OK", "TOOL_CALL_IN_PROGRESS"}
    executed = [r for r in await db.audit_rows(fleet_database, run_id=run_id) if r.kind == "tool_call"]
    assert len(executed) == 1 and executed[0].outcome == "OK"


async def test_concurrent_identical_calls_never_exceed_the_repeat_limit(server, http, probe):
    run_id = await new_run(http, server, ALICE, max_repeats=3)
    calls = [tool_call("count", {"text": "identical"}, call_id=f"c{i}") for i in range(20)]
    contents = await call_each(http, [server], run_id, calls, ALICE)
    assert Counter(outcome(c) for c in contents) == {"OK": 3, "REPEATED_CALL": 17}
    assert sum(probe.executions.values()) == 3


async def test_the_repeat_limit_holds_across_gateway_processes(fleet, http):
    run_id = await new_run(http, fleet[0], ALICE, max_repeats=3)
    calls = [tool_call("add", {"a": 40, "b": 2}, call_id=f"c{i}") for i in range(21)]
    contents = await call_each(http, fleet, run_id, calls, ALICE)
    assert Counter(outcome(c) for c in contents) == {"OK": 3, "REPEATED_CALL": 18}
