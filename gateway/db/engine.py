"""The database: one async engine per process, created in the app's lifespan.

PostgreSQL goes through asyncpg; the hot path borrows the pooled connection's raw
asyncpg driver (see ``Database.driver``). SQLite goes through aiosqlite with
``BEGIN IMMEDIATE`` transactions, so that two writers queue instead of failing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from gateway.settings import Settings


class Database:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.is_postgres = self.dialect == "postgresql"

    @classmethod
    def from_settings(cls, settings: Settings) -> Database:
        return cls(create_engine(settings))

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection for reads; nothing it does is committed."""
        async with self.engine.connect() as conn:
            yield conn

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction: committed when the block ends, rolled back when it raises."""
        async with self.engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def driver(self) -> AsyncIterator[Any]:
        """The raw asyncpg connection of a pooled connection (PostgreSQL only), in autocommit.

        Used by the hot path, which runs one statement per batch and needs none of the
        ORM's or Core's per-statement work.
        """
        async with self.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            yield raw.driver_connection

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()


def create_engine(settings: Settings) -> AsyncEngine:
    if settings.is_sqlite:
        return _create_sqlite_engine(settings)
    return create_async_engine(
        settings.database_url,
        pool_size=settings.database_pool_size,
        max_overflow=settings.database_pool_size,
        pool_timeout=settings.database_pool_timeout_s,
        pool_recycle=1800,
        connect_args={
            "timeout": settings.database_pool_timeout_s,
            "command_timeout": settings.database_statement_timeout_s + 5,
            "server_settings": {
                "application_name": "gateway",
                "statement_timeout": str(int(settings.database_statement_timeout_s * 1000)),
            },
        },
    )


def _create_sqlite_engine(settings: Settings) -> AsyncEngine:
    engine = create_async_engine(
        settings.database_url,
        pool_size=settings.database_pool_size,
        max_overflow=0,
        pool_timeout=settings.database_pool_timeout_s,
        connect_args={"timeout": 30},
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Take the write lock at the start: a deferred transaction that later writes can
        # fail with "database is locked" instead of waiting its turn.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
