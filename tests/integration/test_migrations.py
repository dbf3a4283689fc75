"""Alembic migrations are the schema: they build the schema and match the models."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.db.migrate import check_models_match, upgrade_to_head
from gateway.db.models import Base


async def table_names(url: str) -> set[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


def test_the_models_match_the_migrated_postgresql_schema(pg_url):
    check_models_match(pg_url)  # `alembic check`: raises when autogenerate would find a difference


def test_upgrade_head_builds_every_table_in_a_new_database(empty_pg_url):
    upgrade_to_head(empty_pg_url)
    made = asyncio.run(table_names(empty_pg_url))
    # audit_events' partitions are the database's (gateway/db/sql/audit_partitions.sql): the
    # default one, this month's and three ahead.
    partitions = {name for name in made if name.startswith("audit_events_")}
    assert set(Base.metadata.tables) | {"alembic_version"} == made - partitions
    assert "audit_events_default" in partitions and len(partitions) == 5


def test_upgrade_head_is_idempotent(empty_pg_url):
    upgrade_to_head(empty_pg_url)
    upgrade_to_head(empty_pg_url)
    assert "audit_events" in asyncio.run(table_names(empty_pg_url))


def test_the_hot_path_functions_exist_on_postgresql(pg_url):
    async def functions() -> set[str]:
        engine = create_async_engine(pg_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(sa.text("SELECT proname FROM pg_proc WHERE proname LIKE 'gateway_%'"))
                return {row[0] for row in rows}
        finally:
            await engine.dispose()

    assert {"gateway_admit_calls", "gateway_record_calls"} <= asyncio.run(functions())
