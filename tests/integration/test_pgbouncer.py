"""The gateway behind a real PgBouncer in transaction pooling mode (Debian's `pgbouncer`, started
by the test): two `gateway serve` processes reach PostgreSQL only through it, with
``GATEWAY_DATABASE_PGBOUNCER=true``; PgBouncer has fewer server connections than the gateways
have pooled, so consecutive transactions of one gateway connection land on different server
sessions. Migrations ran against PostgreSQL directly (the template), as the docs say."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.db.engine import Database
from gateway.settings import Settings, SettingsError
from tests.conftest import _admin, seeded
from tests.support.calls import batch, contents, outcome, tool_call as call
from tests.support.logs import CapturedLogs
from tests.support.pgbouncer import PgBouncer, pgbouncer
from tests.support.postgres import PostgresServer
from tests.support.processes import GatewayProcess, gateway_env, run_cli, start_gateway, wait_until_ready
from tests.support.tokens import auth_for, make_token

pytestmark = pytest.mark.postgres

CONCURRENT_REQUESTS = 50
BUDGET = 10
TIMEOUTS = "SET statement_timeout = '10s'", "SET idle_in_transaction_session_timeout = '30s'"


@pytest.fixture(scope="module")
def database(postgres: PostgresServer, pg_template: str) -> Iterator[tuple[str, str]]:
    """A migrated, seeded database (SQLAlchemy URL, libpq DSN), reached directly, with the session
    timeouts set on it as docs/operations.md tells operators to set them on the gateway's role."""
    name = f"gw_bouncer_{uuid.uuid4().hex[:10]}"
    _admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    _admin(postgres, *(f'ALTER DATABASE "{name}" {setting}' for setting in TIMEOUTS))
    url = postgres.sqlalchemy_url(name)
    asyncio.run(seeded(url))
    yield url, postgres.dsn_for(name)
    _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def bouncer(postgres: PostgresServer) -> Iterator[PgBouncer]:
    with pgbouncer(postgres.admin_dsn, pool_size=4) as started:
        yield started


@pytest.fixture(scope="module")
def gateways(database: tuple[str, str], bouncer: PgBouncer) -> Iterator[list[GatewayProcess]]:
    """Two `gateway serve` processes through PgBouncer, sealing often."""
    env = gateway_env(
        bouncer.url(database[0]),
        database_pgbouncer=True,
        database_pool_size=10,
        audit_seal_interval_s=0.2,
        rate_limit_user_rps=1000,
        rate_limit_user_burst=1000,
        log_level="WARNING",
    )
    with tempfile.TemporaryDirectory(prefix="gateway-logs-") as logs:
        started = [start_gateway(env, Path(logs) / f"gateway-{i}.log", "--no-migrate") for i in range(2)]
        try:
            wait_until_ready(*started)
            yield started
        finally:
            for gateway in started:
                gateway.stop()


@pytest.fixture
async def db(database: tuple[str, str]) -> AsyncIterator[asyncpg.Connection]:
    """PostgreSQL itself, to check what the gateways wrote."""
    conn = await asyncpg.connect(database[1])
    yield conn
    await conn.close()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=CONCURRENT_REQUESTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits, follow_redirects=False) as http:
        yield http


async def new_run(client: httpx.AsyncClient, gateway: GatewayProcess, user: str, **limits: int) -> str:
    response = await client.post(gateway.url + "/v1/runs", json=limits, headers=auth_for(user))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def assert_no_statement_errors(gateways: list[GatewayProcess], bouncer: PgBouncer) -> None:
    """Neither gateway logged an error or a warning (a prepared-statement clash is an error),
    nor found the role's timeouts looser than its settings; PgBouncer refused nothing."""
    for gateway in gateways:
        problems = [e for e in gateway.log_events() if e.get("level") in {"warning", "error", "critical"}]
        assert problems == [], problems
        assert "prepared statement" not in gateway.log_path.read_text()
    assert "prepared statement" not in bouncer.log()
    assert "unsupported startup parameter" not in bouncer.log()


async def test_calls_and_replays_work_through_pgbouncer(
    gateways: list[GatewayProcess], bouncer: PgBouncer, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    run = await new_run(client, gateways[0], "alice")
    first = [call("add", {"a": i, "b": 1}, call_id=f"c{i}") for i in range(5)]
    path = f"/v1/runs/{run}/tool-calls"
    answered = await client.post(gateways[0].url + path, json=batch(*first), headers=auth_for("alice"))
    assert answered.status_code == 200, answered.text
    assert [outcome(c) for c in contents(answered.json())] == ["OK"] * 5
    # The same calls again, on the other process: replayed from the ledger, not executed again.
    replayed = await client.post(gateways[1].url + path, json=batch(*first), headers=auth_for("alice"))
    assert replayed.status_code == 200, replayed.text
    assert contents(replayed.json()) == contents(answered.json())
    assert await db.fetchval("SELECT used_tool_calls FROM runs WHERE id = $1", run) == 5
    executed = await db.fetchval("SELECT count(*) FROM audit_events WHERE run_id = $1 AND kind = 'tool_call'", run)
    assert executed == 5
    assert_no_statement_errors(gateways, bouncer)


async def test_an_approval_through_pgbouncer_executes_once(
    gateways: list[GatewayProcess], bouncer: PgBouncer, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    title = f"Through PgBouncer {uuid.uuid4().hex[:8]}"
    run = await new_run(client, gateways[1], "bob")
    requested = await client.post(
        f"{gateways[1].url}/v1/runs/{run}/tool-calls",
        json=batch(call("create_article", {"title": title, "body": "Once."})),
        headers=auth_for("bob"),
    )
    assert requested.status_code == 200, requested.text
    approval_id = contents(requested.json())[0]["error"]["approval_id"]
    decisions = await asyncio.gather(
        *(
            client.post(f"{gateway.url}/v1/admin/approvals/{approval_id}/approve", headers=auth_for("carol"))
            for gateway in itertools.islice(itertools.cycle(gateways), 6)
        )
    )
    assert sorted(r.status_code for r in decisions) == [200] + [409] * 5
    assert all(r.json()["error"]["code"] == "ALREADY_DECIDED" for r in decisions if r.status_code == 409)
    assert await db.fetchval("SELECT count(*) FROM articles WHERE title = $1", title) == 1
    assert await db.fetchval("SELECT status FROM approvals WHERE id = $1", approval_id) == "succeeded"
    assert_no_statement_errors(gateways, bouncer)


async def test_the_budget_holds_exactly_through_pgbouncer_across_two_processes(
    gateways: list[GatewayProcess], bouncer: PgBouncer, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    run = await new_run(client, gateways[0], "alice", max_tool_calls=BUDGET)
    targets = itertools.islice(itertools.cycle(gateways), CONCURRENT_REQUESTS)
    responses = await asyncio.gather(
        *(
            client.post(
                f"{gateway.url}/v1/runs/{run}/tool-calls",
                json=batch(call("add", {"a": i, "b": 1}, call_id=f"c{i}")),
                headers=auth_for("alice"),
            )
            for i, gateway in enumerate(targets)
        )
    )
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    outcomes = Counter(outcome(contents(r.json())[0]) for r in responses)
    assert outcomes == {"OK": BUDGET, "BUDGET_EXCEEDED": CONCURRENT_REQUESTS - BUDGET}, outcomes
    assert await db.fetchval("SELECT used_tool_calls FROM runs WHERE id = $1", run) == BUDGET
    rows = await db.fetch("SELECT outcome FROM audit_events WHERE run_id = $1 AND kind = 'tool_call'", run)
    audited = Counter(r["outcome"] for r in rows)
    assert audited == {"OK": BUDGET, "BUDGET_EXCEEDED": CONCURRENT_REQUESTS - BUDGET}, audited
    assert_no_statement_errors(gateways, bouncer)


async def test_the_sealers_seal_through_pgbouncer_and_the_chain_verifies(
    gateways: list[GatewayProcess],
    bouncer: PgBouncer,
    database: tuple[str, str],
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
) -> None:
    run = await new_run(client, gateways[0], "alice")
    responses = await asyncio.gather(
        *(
            client.post(
                f"{gateway.url}/v1/runs/{run}/tool-calls",
                json=batch(call("add", {"a": i, "b": 2}), call("divide", {"a": i, "b": i % 2})),
                headers=auth_for("alice"),
            )
            for i, gateway in enumerate(itertools.islice(itertools.cycle(gateways), 20))
        )
    )
    assert all(r.status_code == 200 for r in responses)
    # Both processes run a sealer; they take turns through a transaction-scoped advisory lock.
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
    verified = await asyncio.to_thread(
        run_cli, bouncer.url(database[0]), "audit", "verify", "--tenant", "acme", database_pgbouncer=True
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"OK, {rows} sealed row(s) verified" in verified.stdout
    assert_no_statement_errors(gateways, bouncer)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_mcp_endpoint_calls_tools_through_pgbouncer(
    gateways: list[GatewayProcess], bouncer: PgBouncer, db: asyncpg.Connection, mode: str
) -> None:
    token = make_token("acme", "alice", extra={"jti": uuid.uuid4().hex})
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        transport = streamable_http_client(f"{gateways[1].url}/mcp", http_client=http)
        async with Client(transport, mode=mode, cache=None, read_timeout_seconds=60) as client:  # type: ignore[arg-type]
            results = [await client.call_tool("add", {"a": n, "b": 40}) for n in range(3)]
    assert [r.structured_content for r in results] == [{"result": 40}, {"result": 41}, {"result": 42}]
    assert_no_statement_errors(gateways, bouncer)


async def test_without_the_setting_the_gateway_is_not_ready_and_answers_service_unavailable(
    database: tuple[str, str], bouncer: PgBouncer, tmp_path: Path
) -> None:
    # PgBouncer refuses the session settings the gateway sends at connect on a direct connection.
    env = gateway_env(bouncer.url(database[0]), log_level="WARNING")
    gateway = start_gateway(env, tmp_path / "gateway.log", "--no-migrate")
    try:
        async with httpx.AsyncClient(timeout=30, follow_redirects=False) as client:
            ready = None
            for _ in range(300):
                assert gateway.process.poll() is None, gateway.log_path.read_text()
                try:
                    ready = await client.get(gateway.url + "/readyz")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            assert ready is not None and ready.status_code == 503, gateway.log_path.read_text()
            answered = await client.post(gateway.url + "/v1/runs", json={}, headers=auth_for("alice"))
        assert answered.status_code == 503
        assert answered.json()["error"]["code"] == "SERVICE_UNAVAILABLE"
        assert "statement_timeout" not in answered.text
    finally:
        gateway.stop()
    assert "unsupported startup parameter: statement_timeout" in bouncer.log()
    refused = [e for e in gateway.log_events() if e.get("event") == "database_refused_session_settings"]
    assert refused and "GATEWAY_DATABASE_PGBOUNCER=true" in refused[0]["hint"]


async def test_the_gateway_warns_when_the_roles_timeouts_are_looser_than_its_settings(
    postgres: PostgresServer, pg_template: str, bouncer: PgBouncer, logs: CapturedLogs
) -> None:
    name = f"gw_bouncer_loose_{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(_admin, postgres, f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    try:
        settings = Settings.from_flat(database_url=bouncer.url(postgres.sqlalchemy_url(name)), database_pgbouncer=True)
        database = Database.from_settings(settings)
        try:
            async with database.driver() as conn:
                assert await conn.fetchval("SELECT current_setting('application_name')") == "gateway"
        finally:
            await database.dispose()
        (warning,) = logs.named("database_session_timeouts_looser_than_settings")
        assert warning["found"] == {"idle_in_transaction_session_timeout": "0", "statement_timeout": "0"}
        assert warning["expected_ms"] == {"idle_in_transaction_session_timeout": 30000, "statement_timeout": 10000}
    finally:
        await asyncio.to_thread(_admin, postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_the_gateway_stays_quiet_when_the_roles_timeouts_hold(
    database: tuple[str, str], bouncer: PgBouncer, logs: CapturedLogs
) -> None:
    settings = Settings.from_flat(database_url=bouncer.url(database[0]), database_pgbouncer=True)
    database_ = Database.from_settings(settings)
    try:
        async with database_.driver() as conn:
            assert await conn.fetchval("SELECT current_setting('statement_timeout')") == "10s"
    finally:
        await database_.dispose()
    assert logs.named("database_session_timeouts_looser_than_settings") == []


async def test_through_pgbouncer_no_named_statement_is_left_on_a_server_session(
    database: tuple[str, str], bouncer: PgBouncer
) -> None:
    settings = Settings.from_flat(database_url=bouncer.url(database[0]), database_pgbouncer=True)
    database_ = Database.from_settings(settings)
    try:
        async with database_.driver() as conn:
            assert await conn.fetchval("SELECT $1::int + 1", 1) == 2
            assert await conn.fetchval("SELECT count(*) FROM pg_prepared_statements") == 0
        async with database_.begin() as conn:
            assert await conn.scalar(sa.text("SELECT CAST(:n AS int) + 1"), {"n": 1}) == 2
            assert await conn.scalar(sa.text("SELECT count(*) FROM pg_prepared_statements")) == 0
    finally:
        await database_.dispose()


async def test_a_direct_connection_keeps_prepared_statements_and_its_session_settings(
    database: tuple[str, str],
) -> None:
    settings = Settings.from_flat(database_url=database[0], database_statement_timeout_s=7.0)
    assert settings.database.pgbouncer is False
    database_ = Database.from_settings(settings)
    try:
        async with database_.driver() as conn:
            assert await conn.fetchval("SELECT current_setting('statement_timeout')") == "7s"
            assert await conn.fetchval("SELECT $1::int + 1", 1) == 2
            assert await conn.fetchval("SELECT count(*) FROM pg_prepared_statements") >= 1
        async with database_.begin() as conn:
            assert await conn.scalar(sa.text("SELECT current_setting('statement_timeout')")) == "7s"
            assert await conn.scalar(sa.text("SELECT count(*) FROM pg_prepared_statements")) >= 1
    finally:
        await database_.dispose()


@pytest.mark.parametrize("value", ["tru\x00e", "ｔｒｕｅ", "[true]", "2", "on please"])
def test_a_hostile_pgbouncer_setting_is_refused_by_name(value: str) -> None:
    with pytest.raises(SettingsError, match="GATEWAY_DATABASE_PGBOUNCER"):
        Settings.from_env({"GATEWAY_DATABASE_PGBOUNCER": value})
