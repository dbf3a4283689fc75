"""Every path through the migrations ends at the same schema: ``alembic upgrade head`` from an
empty database, from each earlier revision, and after downgrading one step. Each path ends
where the models are (``alembic check``) and with the same hot-path functions and triggers as
the database the suite migrated once. PostgreSQL."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from alembic import command
from alembic.script import ScriptDirectory

from gateway.db.migrate import alembic_config, check_models_match, migrations_dir
from tests.support.postgres import PostgresServer


def _revisions() -> list[str]:
    script = ScriptDirectory(str(migrations_dir()))
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


REVISIONS = _revisions()

_DATABASE_CODE = """
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
       || md5(pg_get_functiondef(p.oid))
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public' AND p.proname LIKE 'gateway_%'
UNION ALL
SELECT 'trigger ' || t.tgrelid::regclass::text || ' ' || t.tgname || ' ' || md5(pg_get_triggerdef(t.oid))
  FROM pg_trigger t
 WHERE NOT t.tgisinternal
"""


async def _database_code(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {row[0] for row in await conn.fetch(_DATABASE_CODE)}
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def head_code(postgres: PostgresServer, pg_template: str) -> set[str]:
    """The functions and triggers of the database migrated once to head."""
    return asyncio.run(_database_code(postgres.dsn_for(pg_template)))


def _at_head(url: str, head_code: set[str]) -> None:
    check_models_match(url)  # `alembic check`: raises when autogenerate would find a difference
    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    assert asyncio.run(_database_code(dsn)) == head_code


def test_the_revisions_are_found_in_order():
    assert REVISIONS[0] == "0001" and len(REVISIONS) == len(set(REVISIONS)) >= 7
    assert REVISIONS == sorted(REVISIONS)


def test_upgrade_head_from_an_empty_database(empty_pg_url, head_code):
    url = empty_pg_url
    command.upgrade(alembic_config(url), "head")
    _at_head(url, head_code)
    assert "function gateway_admit_calls(p_batches jsonb, p_contents jsonb)" in {
        entry.rsplit(" ", 1)[0] for entry in head_code
    }


@pytest.mark.parametrize("revision", REVISIONS[:-1])
def test_upgrade_head_from_an_earlier_revision(empty_pg_url, head_code, revision):
    url = empty_pg_url
    config = alembic_config(url)
    command.upgrade(config, revision)
    command.upgrade(config, "head")
    _at_head(url, head_code)


@pytest.mark.parametrize("revision", REVISIONS)
def test_downgrade_one_step_then_upgrade_head(empty_pg_url, head_code, revision):
    url = empty_pg_url
    config = alembic_config(url)
    command.upgrade(config, revision)
    command.downgrade(config, "-1")
    command.upgrade(config, "head")
    _at_head(url, head_code)
