"""The models and the migrations agree, 0003 included (alembic check)."""

from __future__ import annotations

import asyncio

from gateway.db.migrate import check_models_match


async def test_models_match_the_migrations(database_url):
    await asyncio.to_thread(check_models_match, database_url)
