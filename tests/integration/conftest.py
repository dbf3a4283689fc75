"""Fixtures of the integration tests: the demo database as the gateway opens it, and several
`gateway serve` processes sharing one PostgreSQL database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from gateway.db.engine import Database
from tests.support.app import seeded
from tests.support.db import open_database
from tests.support.postgres import PostgresServer
from tests.support.processes import gateways

FLEET_SIZE = 3


async def _admin(server: PostgresServer, statement: str) -> None:
    conn = await asyncpg.connect(server.admin_dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    """The demo tenants' database, opened as the gateway opens it."""
    await seeded(database_url)
    async with open_database(database_url) as database:
        yield database


@pytest.fixture(scope="module")
def fleet_database(postgres: PostgresServer, pg_template: str) -> Iterator[str]:
    """A seeded database shared by the tests of one module (each uses runs of its own)."""
    name = f"gw_fleet_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    url = postgres.sqlalchemy_url(name)
    asyncio.run(seeded(url))
    yield url
    asyncio.run(_admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def fleet(fleet_database: str) -> Iterator[list[str]]:
    """Base URLs of several `gateway serve` processes sharing one PostgreSQL database."""
    with gateways(fleet_database, FLEET_SIZE, policy_cache_s=0) as started:
        yield [gateway.url for gateway in started]
