"""Shared fixtures: a real PostgreSQL (found or started, never skipped), migrated databases,
and the app behind Litestar's test client."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import structlog
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.db.embedded import EmbeddedPostgres, EmbeddedPostgresError
from gateway.db.migrate import upgrade_to_head
from gateway.db.models import Base
from gateway.tools.registry import ToolRegistry
from tests.support.app import make_settings, seeded
from tests.support.keys import ec_key, public_jwk, rsa_key
from tests.support.logs import CapturedLogs
from tests.support.loopback import JwksServer
from tests.support.postgres import PostgresServer, find_or_start_postgres
from tests.support.tools import Probe, registry_with_probe


def _admin(server: PostgresServer, *statements: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(server.admin_dsn)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    try:
        server = find_or_start_postgres()
    except EmbeddedPostgresError as exc:
        pytest.exit(str(exc), returncode=3)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_template(postgres: PostgresServer) -> Iterator[str]:
    """A database migrated once with `alembic upgrade head`; each test gets a copy."""
    name = f"gw_tpl_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _admin(postgres, f'CREATE DATABASE "{name}"')
    upgrade_to_head(postgres.sqlalchemy_url(name))
    yield name
    _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg_copy(server: PostgresServer, template: str) -> Iterator[str]:
    name = f"gw_t_{uuid.uuid4().hex[:12]}"
    _admin(server, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    yield server.sqlalchemy_url(name)
    _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_pg_url(postgres: PostgresServer) -> Iterator[str]:
    """A new database with nothing in it, not even migrations."""
    name = f"gw_e_{uuid.uuid4().hex[:12]}"
    _admin(postgres, f'CREATE DATABASE "{name}"')
    yield postgres.sqlalchemy_url(name)
    _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(postgres: PostgresServer, pg_template: str) -> Iterator[str]:
    """A fresh migrated PostgreSQL database."""
    yield from _pg_copy(postgres, pg_template)


@pytest.fixture(scope="session")
def pg_seeded_database(postgres: PostgresServer, pg_template: str) -> Iterator[str]:
    """One migrated database for the session, emptied and seeded anew for each test that uses
    it: dropping a database forces a checkpoint, which on a busy machine costs seconds."""
    name = f"gw_seeded_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield name
    _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _empty(dsn: str, database: str) -> None:
    tables = ", ".join(f'"{table.name}"' for table in Base.metadata.sorted_tables)
    conn = await asyncpg.connect(dsn)
    try:
        # Whatever a previous test left connected must not hold a lock on a table.
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
        await conn.execute("SET lock_timeout = '10s'")
        await conn.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    finally:
        await conn.close()


@pytest.fixture
def seeded_pg_url(postgres: PostgresServer, pg_seeded_database: str) -> str:
    """A migrated PostgreSQL database holding only the demo tenants."""
    url = postgres.sqlalchemy_url(pg_seeded_database)

    async def reset() -> None:
        await _empty(postgres.dsn_for(pg_seeded_database), pg_seeded_database)
        await seeded(url)

    asyncio.run(reset())
    return url


@pytest.fixture
def database_url(seeded_pg_url: str) -> str:
    """A fresh migrated database with the demo tenants."""
    return seeded_pg_url


@pytest.fixture
def reachable_tmp() -> Iterator[Path]:
    """A temporary folder for an embedded PostgreSQL: as root, the server runs as another user,
    who must be able to enter it (pytest's own temporary folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="gateway-test-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        for pid_file in folder.rglob("postmaster.pid"):  # whatever a failed test left running
            server = EmbeddedPostgres(pid_file.parent)
            if server.is_running():
                server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """Override in a test module to change the app's settings."""
    return {}


@pytest.fixture
def probe() -> Probe:
    """What the probe's tools (tests.support.tools) were asked to do, in this test."""
    return Probe()


@pytest.fixture
def tool_registry(request: pytest.FixtureRequest) -> ToolRegistry | None:
    """The tools the app serves: the built-in ones (None), and the probe's too in a module marked
    ``probe_tools``. Override in a test module to serve other tools."""
    if request.node.get_closest_marker("probe_tools"):
        return registry_with_probe(request.getfixturevalue("probe"))
    return None


@asynccontextmanager
async def _test_client(
    database_url: str, settings_overrides: dict[str, Any], tool_registry: ToolRegistry | None
) -> AsyncIterator[AsyncTestClient]:
    app = create_app(make_settings(database_url, **settings_overrides), registry=tool_registry)
    async with AsyncTestClient(app=app) as test_client:
        yield test_client


@pytest.fixture
async def client(
    database_url: str, settings_overrides: dict[str, Any], tool_registry: ToolRegistry | None
) -> AsyncIterator[AsyncTestClient]:
    """The app behind Litestar's test client."""
    async with _test_client(database_url, settings_overrides, tool_registry) as test_client:
        yield test_client


@pytest.fixture
async def pg_client(
    seeded_pg_url: str, settings_overrides: dict[str, Any], tool_registry: ToolRegistry | None
) -> AsyncIterator[AsyncTestClient]:
    """The app on PostgreSQL, behind Litestar's test client."""
    async with _test_client(seeded_pg_url, settings_overrides, tool_registry) as test_client:
        yield test_client


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    """An identity provider's key set on a loopback port: an RSA and an EC key (tests.support.keys)."""
    with JwksServer() as server:
        server.keys = [public_jwk("rsa-1", rsa_key("rsa-1"), "RS256"), public_jwk("ec-1", ec_key("ec-1"), "ES256")]
        yield server


@pytest.fixture
def logs() -> Iterator[CapturedLogs]:
    """Everything structlog emits during the test, through the gateway's own processors."""
    captured = CapturedLogs()
    captured.install()
    try:
        yield captured
    finally:
        structlog.reset_defaults()
