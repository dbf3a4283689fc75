"""The rate-limit tables of migration 0004 and the models agree."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from gateway.db.engine import Database
from gateway.db.migrate import check_models_match
from gateway.settings import Settings


async def test_models_match_the_migrated_schema(database_url: str) -> None:
    await asyncio.to_thread(check_models_match, database_url)


async def test_an_override_needs_a_known_scope_and_a_positive_rate(database_url: str) -> None:
    from tests.conftest import seeded

    await seeded(database_url)
    db = Database.from_settings(Settings.from_flat(database_url=database_url))
    try:
        for scope, rate, burst in (("everyone", 1.0, 1), ("user", 0.0, 1), ("user", 1.0, 0)):
            with pytest.raises(sa.exc.IntegrityError):
                async with db.begin() as conn:
                    await conn.execute(
                        sa.text(
                            "INSERT INTO rate_limit_overrides (tenant_id, scope, rate_per_s, burst) "
                            "VALUES ('acme', :scope, :rate, :burst)"
                        ),
                        {"scope": scope, "rate": rate, "burst": burst},
                    )
    finally:
        await db.dispose()
