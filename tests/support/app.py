"""The app's settings in tests, and the demo data every client test starts from."""

from __future__ import annotations

from typing import Any

from gateway.db.engine import Database
from gateway.demo import seed_demo
from gateway.settings import Settings
from tests.support.tokens import TEST_SECRET


def make_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "jwt_secret": TEST_SECRET,
        "jwt_leeway_s": 0,
        "policy_cache_s": 0.0,
        "log_level": "WARNING",
    }
    values.update(overrides)
    return Settings.from_flat(**values)


async def seeded(database_url: str) -> None:
    db = Database.from_settings(Settings.from_flat(database_url=database_url))
    try:
        await seed_demo(db)
    finally:
        await db.dispose()
