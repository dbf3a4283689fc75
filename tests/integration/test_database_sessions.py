"""What every gateway session on PostgreSQL runs under, on the engine's pool and the hot path's."""

from __future__ import annotations

import sqlalchemy as sa

from gateway.db.engine import Database
from gateway.settings import Settings


async def test_both_pools_end_a_session_left_idle_in_a_transaction(seeded_pg_url):
    settings = Settings.from_flat(database_url=seeded_pg_url, database_idle_in_transaction_timeout_s=7.5,
                        database_statement_timeout_s=4)
    db = Database.from_settings(settings)
    try:
        async with db.connect() as conn:
            engine_side = await conn.scalar(sa.text("SHOW idle_in_transaction_session_timeout"))
            engine_statement = await conn.scalar(sa.text("SHOW statement_timeout"))
        async with db.driver() as conn:
            driver_side = await conn.fetchval("SHOW idle_in_transaction_session_timeout")
            driver_statement = await conn.fetchval("SHOW statement_timeout")
    finally:
        await db.dispose()
    assert engine_side == driver_side == "7500ms"
    assert engine_statement == driver_statement == "4s"


def test_the_idle_in_transaction_timeout_defaults_to_30_s():
    assert Settings().database.idle_in_transaction_timeout_s == 30.0
