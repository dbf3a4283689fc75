"""Three gateway processes on loopback ports sharing one PostgreSQL, used all at once."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import _admin, seeded
from tests.support.calls import batch, contents, outcome, tool_call as call
from tests.support.postgres import PostgresServer
from tests.support.prometheus import samples, value
from tests.support.processes import GatewayProcess, gateway_env, run_cli, start_gateway, wait_until_ready
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def shared_database(postgres: PostgresServer, pg_template: str) -> Iterator[tuple[str, str]]:
    name = f"gw_scale_{uuid.uuid4().hex[:10]}"
    _admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    url = postgres.sqlalchemy_url(name)
    asyncio.run(seeded(url))
    yield url, postgres.dsn_for(name)
    _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def gateways(shared_database: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """Three processes; the third runs two workers (Prometheus multiprocess mode)."""
    logs = tmp_path_factory.mktemp("gateway-logs")
    env = gateway_env(
        shared_database[0], rate_limit_user_rps=1000, rate_limit_user_burst=1000, database_pool_size=5
    )
    started = [
        start_gateway(env, logs / "first.log", "--no-migrate"),
        start_gateway(env, logs / "second.log", "--no-migrate"),
        start_gateway(env, logs / "third.log", "--no-migrate", "--workers", "2"),
    ]
    try:
        wait_until_ready(*started)
        yield started
    finally:
        for gateway in started:
            gateway.stop()


@pytest.fixture
async def db(shared_database: tuple[str, str]) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(shared_database[1])
    yield conn
    await conn.close()


def fresh_connections() -> httpx.AsyncClient:
    """A client that opens a new connection per request, so requests spread over a server's workers."""
    return httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


async def new_run(client: httpx.AsyncClient, gateway: GatewayProcess, user: str, **limits: int) -> str:
    response = await client.post(gateway.url + "/v1/runs", json=limits, headers=auth_for(user))
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def test_a_runs_budget_holds_exactly_across_three_processes(
    gateways: list[GatewayProcess], db: asyncpg.Connection
) -> None:
    async with fresh_connections() as client:
        run = await new_run(client, gateways[0], "alice", max_tool_calls=10)
        targets = itertools.islice(itertools.cycle(gateways), 50)
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{gateway.url}/v1/runs/{run}/tool-calls",
                    json=batch(call("add", {"a": i, "b": 1})),
                    headers=auth_for("alice"),
                )
                for i, gateway in enumerate(targets)
            )
        )
    outcomes = [outcome(contents(r.json())[0]) for r in responses]
    assert outcomes.count("OK") == 10
    assert outcomes.count("BUDGET_EXCEEDED") == 40
    assert await db.fetchval("SELECT used_tool_calls FROM runs WHERE id = $1", run) == 10


async def test_an_approval_executes_exactly_once_across_three_processes(
    gateways: list[GatewayProcess], db: asyncpg.Connection
) -> None:
    title = f"Scale-out {uuid.uuid4().hex[:8]}"
    async with fresh_connections() as client:
        run = await new_run(client, gateways[1], "bob")
        requested = await client.post(
            f"{gateways[1].url}/v1/runs/{run}/tool-calls",
            json=batch(call("create_article", {"title": title, "body": "Once."})),
            headers=auth_for("bob"),
        )
        approval_id = contents(requested.json())[0]["error"]["approval_id"]
        decisions = await asyncio.gather(
            *(
                client.post(f"{gateway.url}/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
                for gateway in itertools.islice(itertools.cycle(gateways), 9)
            )
        )
    statuses = sorted(r.status_code for r in decisions)
    assert statuses == [200] + [409] * 8
    assert all(r.json()["error"]["code"] == "ALREADY_DECIDED" for r in decisions if r.status_code == 409)
    assert await db.fetchval("SELECT count(*) FROM articles WHERE title = $1", title) == 1
    assert await db.fetchval("SELECT status FROM approvals WHERE id = $1", approval_id) == "succeeded"


async def test_the_audit_chain_verifies_after_concurrent_writers_and_sealers_in_three_processes(
    gateways: list[GatewayProcess], shared_database: tuple[str, str], db: asyncpg.Connection
) -> None:
    async with fresh_connections() as client:
        runs = {user: await new_run(client, gateways[0], user, max_tool_calls=1000) for user in ("alice", "bob")}
        targets = itertools.islice(itertools.cycle(gateways), 90)
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{gateway.url}/v1/runs/{runs[user]}/tool-calls",
                    json=batch(call("add", {"a": i, "b": 1}), call("divide", {"a": i, "b": i % 3})),
                    headers=auth_for(user),
                )
                for i, (gateway, user) in enumerate(zip(targets, itertools.cycle(("alice", "bob"))))
            )
        )
    assert all(r.status_code == 200 for r in responses)
    # Every process runs a sealer; they take turns linking the rows all three appended.
    for _ in range(300):
        unsealed = await db.fetchval(
            "SELECT count(*) FROM audit_events a WHERE NOT EXISTS "
            "(SELECT 1 FROM audit_links l WHERE l.tenant_id = a.tenant_id AND l.audit_id = a.id)"
        )
        if unsealed == 0:
            break
        await asyncio.sleep(0.1)
    assert unsealed == 0
    rows = await db.fetchval("SELECT count(*) FROM audit_events WHERE tenant_id = 'acme'")
    assert rows >= 180  # two calls per request

    verified = await asyncio.to_thread(run_cli, shared_database[0], "audit", "verify", "--tenant", "acme")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"OK, {rows} sealed row(s) verified" in verified.stdout
    assert "0 row(s) not sealed yet" in verified.stdout
    positions = await db.fetch(
        "SELECT chain_seq FROM audit_links WHERE tenant_id = 'acme' ORDER BY chain_seq"
    )
    assert [r["chain_seq"] for r in positions] == list(range(positions[0]["chain_seq"], positions[0]["chain_seq"] + rows))


async def test_rate_limits_hold_across_processes_and_say_when_to_retry(
    gateways: list[GatewayProcess], db: asyncpg.Connection
) -> None:
    # globex users may make 5 requests (and, for this test, gain no more).
    await db.execute(
        "INSERT INTO rate_limit_overrides (tenant_id, scope, rate_per_s, burst) VALUES ('globex', 'user', 0.001, 5)"
    )
    async with fresh_connections() as client:
        responses = await asyncio.gather(
            *(
                client.get(gateway.url + "/v1/tools", headers=auth_for("alice", tenant="globex"))
                for gateway in itertools.islice(itertools.cycle(gateways), 30)
            )
        )
        other_tenant = await client.get(gateways[0].url + "/v1/tools", headers=auth_for("alice"))
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    # Four processes (one with two workers) hold at most one unspent token each.
    assert 1 <= len(admitted) <= 5
    assert all(r.status_code == 429 for r in refused)
    assert all(r.json()["error"]["code"] == "RATE_LIMITED" for r in refused)
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert other_tenant.status_code == 200


async def test_metrics_of_a_multi_worker_process_sum_its_workers(gateways: list[GatewayProcess]) -> None:
    gateway = gateways[2]

    async def scrape(client: httpx.AsyncClient) -> float:
        response = await client.get(gateway.url + "/metrics")
        return value(samples(response.text), "gateway_tool_calls_total", tool="multiply", outcome="OK")

    async with fresh_connections() as client:
        before = await scrape(client)
        run = await new_run(client, gateway, "alice", max_tool_calls=100)
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{gateway.url}/v1/runs/{run}/tool-calls",
                    json=batch(call("multiply", {"a": i, "b": 2})),
                    headers=auth_for("alice"),
                )
                for i in range(40)
            )
        )
        assert all(r.status_code == 200 for r in responses)
        # Scrapes land on either worker; each must report both workers' calls.
        after = [await scrape(client) for _ in range(6)]
    assert after == [before + 40] * 6


async def test_logs_are_json_events_with_request_tenant_user_run_tool_outcome_and_duration(
    gateways: list[GatewayProcess],
) -> None:
    gateway = gateways[0]
    request_id = "trace-" + uuid.uuid4().hex
    async with fresh_connections() as client:
        run = await new_run(client, gateway, "alice")
        response = await client.post(
            f"{gateway.url}/v1/runs/{run}/tool-calls",
            json=batch(call("add", {"a": 40, "b": 2}, call_id="call_logged")),
            headers={**auth_for("alice"), "X-Request-ID": request_id},
        )
    assert response.headers["x-request-id"] == request_id
    for _ in range(50):  # the line may still be in the process's buffer
        events = [e for e in gateway.log_events() if e.get("request_id") == request_id]
        if events:
            break
        await asyncio.sleep(0.1)
    (event,) = [e for e in events if e["event"] == "tool_call_finished"]
    assert event["tenant"] == "acme" and event["user"] == "alice"
    assert event["run"] == run and event["tool"] == "add" and event["tool_call_id"] == "call_logged"
    assert event["outcome"] == "OK"
    assert isinstance(event["duration_ms"], float)
    assert {"timestamp", "level", "pid"} <= event.keys()
    assert "authorization" not in Path(gateway.log_path).read_text().lower()
