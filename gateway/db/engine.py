"""The database: one async engine per process, created in the app's lifespan.

PostgreSQL goes through asyncpg. The hot path (the ledger's one statement per batch
step) uses asyncpg's own pool from the same URL (``Database.driver``): a checkout through
SQLAlchemy's async pool costs a greenlet hop and pool events per statement, which on this
path was a larger share of the CPU than the statement itself. Everything else uses the
SQLAlchemy engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from gateway.settings import Settings, SettingsError


def session_settings(settings: Settings) -> dict[str, str]:
    """What every gateway session on PostgreSQL runs under, on both pools: its name, the longest
    a statement may run, and the longest it may sit idle inside a transaction (a stalled
    caller must not keep a connection, its snapshot and its locks)."""
    return {
        "application_name": "gateway",
        "statement_timeout": str(int(settings.database.statement_timeout_s * 1000)),
        "idle_in_transaction_session_timeout": str(int(settings.database.idle_in_transaction_timeout_s * 1000)),
    }


class Database:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        driver_pool_size: int = 10,
        statement_timeout_s: float = 10.0,
        server_settings: dict[str, str] | None = None,
    ) -> None:
        self.engine = engine
        self._driver_pool: asyncpg.Pool | None = None
        self._driver_pool_lock = asyncio.Lock()
        self._driver_pool_size = driver_pool_size
        self._statement_timeout_s = statement_timeout_s
        self._server_settings = dict(server_settings or {})

    @classmethod
    def from_settings(cls, settings: Settings) -> Database:
        return cls(
            create_engine(settings),
            driver_pool_size=settings.database.pool_size,
            statement_timeout_s=settings.database.statement_timeout_s,
            server_settings=session_settings(settings),
        )

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
    async def driver(self) -> AsyncIterator[asyncpg.Connection]:
        """An asyncpg connection in autocommit, for the hot path."""
        pool = await self.driver_pool()
        async with pool.acquire() as conn:
            yield conn

    async def driver_pool(self) -> asyncpg.Pool:
        """asyncpg's pool for the hot path, opened on first use."""
        if self._driver_pool is not None:
            return self._driver_pool
        async with self._driver_pool_lock:
            if self._driver_pool is None:
                url = self.engine.url.set(drivername="postgresql")
                self._driver_pool = await asyncpg.create_pool(
                    url.render_as_string(hide_password=False),
                    min_size=1,
                    max_size=self._driver_pool_size,
                    command_timeout=self._statement_timeout_s + 5,
                    server_settings=self._server_settings,
                    # The hot path runs single autocommit statements and leaves no session
                    # state behind, so the pool's reset statement on every release is waste.
                    reset=_no_reset,
                )
            return self._driver_pool

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def dispose(self) -> None:
        if self._driver_pool is not None:
            await self._driver_pool.close()
            self._driver_pool = None
        await self.engine.dispose()


async def _no_reset(conn: asyncpg.Connection) -> None:
    return None


def create_engine(settings: Settings) -> AsyncEngine:
    if settings.database.url is None:
        raise SettingsError(
            "GATEWAY_DATABASE_URL is not set: `gateway` commands start the embedded PostgreSQL, "
            "an app built another way needs the URL"
        )
    engine = create_async_engine(
        settings.database.url,
        pool_size=settings.database.pool_size,
        max_overflow=0,
        pool_timeout=settings.database.pool_timeout_s,
        pool_recycle=1800,
        # SQLAlchemy's exception text carries a failed statement's parameters (tool arguments,
        # stored messages): never let them reach a log line or a traceback.
        hide_parameters=True,
        connect_args={
            "timeout": settings.database.pool_timeout_s,
            "command_timeout": settings.database.statement_timeout_s + 5,
            "server_settings": session_settings(settings),
        },
    )
    event.listen(engine.sync_engine, "handle_error", _drop_row_values)
    return engine


def _drop_row_values(context: Any) -> None:
    """PostgreSQL's DETAIL of a failed statement may quote the row (``Failing row contains
    (...)``, ``Key (...)=(...)``), and asyncpg puts it in the exception's text: drop it, as
    ``hide_parameters`` drops the parameters. The SQLSTATE, constraint and table stay."""
    seen: set[int] = set()
    current: BaseException | None = context.original_exception
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, asyncpg.PostgresError):
            current.detail = None
        current = current.__cause__ or current.__context__

