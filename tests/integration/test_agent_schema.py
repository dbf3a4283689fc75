"""The models and the migrations (agent-loop columns and run_messages included) agree."""

from __future__ import annotations

import asyncio

from alembic import command
from alembic.script import ScriptDirectory

from gateway.db.migrate import alembic_config


async def test_models_and_migrations_agree(database_url):
    await asyncio.to_thread(command.check, alembic_config(database_url))


async def test_the_agent_loop_migration_downgrades_and_upgrades_again(database_url):
    config = alembic_config(database_url)
    below = ScriptDirectory.from_config(config).get_revision("0005").down_revision
    await asyncio.to_thread(command.downgrade, config, below)
    await asyncio.to_thread(command.upgrade, config, "head")
    await asyncio.to_thread(command.check, config)
