"""The database: one async engine per process, created in the app's lifespan.

PostgreSQL goes through asyncpg. The hot path (the ledger's one statement per batch
step) uses asyncpg's own pool from the same URL (``Database.driver``): a checkout through
SQLAlchemy's async pool costs a greenlet hop and pool events per statement, which on this
path was a larger share of the CPU than the statement itself. Everything else uses the
SQLAlchemy engine.

Behind PgBouncer in transaction pooling mode (``database.pgbouncer``) consecutive transactions
of one client connection run on different server sessions, so nothing may outlive a
transaction on the server: neither pool keeps named prepared statements (asyncpg's statement
cache and SQLAlchemy's are off, so every statement is an unnamed one, parsed again with its
Bind in one round trip), and the connection sends no session settings but its name (PgBouncer
refuses other startup parameters, and would not keep them per client anyway). The timeouts are
then the database role's (docs/operations.md#pgbouncer); the gateway warns when they are not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import sqlalchemy as sa
import structlog
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from gateway.settings import Settings, SettingsError

log = structlog.get_logger("gateway.db")


def session_timeouts_ms(settings: Settings) -> dict[str, int]:
    """The timeouts a gateway session needs, in milliseconds, by their PostgreSQL names."""
    return {
        "statement_timeout": int(settings.database.statement_timeout_s * 1000),
        "idle_in_transaction_session_timeout": int(settings.database.idle_in_transaction_timeout_s * 1000),
    }


def session_settings(settings: Settings) -> dict[str, str]:
    """What every gateway session on PostgreSQL runs under, on both pools: its name, the longest
    a statement may run, and the longest it may sit idle inside a transaction (a stalled
    caller must not keep a connection, its snapshot and its locks). Through PgBouncer only the
    name: PgBouncer tracks it per client; the timeouts are the role's there (see the module)."""
    if settings.database.pgbouncer:
        return {"application_name": "gateway"}
    return {
        "application_name": "gateway",
        **{name: str(value) for name, value in session_timeouts_ms(settings).items()},
    }


class Database:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        driver_pool_size: int = 10,
        statement_timeout_s: float = 10.0,
        server_settings: dict[str, str] | None = None,
        pgbouncer: bool = False,
        expected_timeouts_ms: dict[str, int] | None = None,
    ) -> None:
        self.engine = engine
        self._driver_pool: asyncpg.Pool | None = None
        self._driver_pool_lock = asyncio.Lock()
        self._driver_pool_size = driver_pool_size
        self._statement_timeout_s = statement_timeout_s
        self._server_settings = dict(server_settings or {})
        self._pgbouncer = pgbouncer
        self._expected_timeouts_ms = dict(expected_timeouts_ms or {})

    @classmethod
    def from_settings(cls, settings: Settings) -> Database:
        return cls(
            create_engine(settings),
            # The group-commit lanes keep a connection each (admissions and records), on top
            # of what the rest of the hot path takes from this pool.
            driver_pool_size=max(settings.database.pool_size, 2 * settings.database.group_commit_lanes + 2),
            statement_timeout_s=settings.database.statement_timeout_s,
            server_settings=session_settings(settings),
            pgbouncer=settings.database.pgbouncer,
            expected_timeouts_ms=session_timeouts_ms(settings),
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
                pool = await asyncpg.create_pool(
                    _driver_dsn(self.engine.url),
                    min_size=1,
                    max_size=self._driver_pool_size,
                    command_timeout=self._statement_timeout_s + 5,
                    server_settings=self._server_settings,
                    # The hot path runs single autocommit statements and leaves no session
                    # state behind, so the pool's reset statement on every release is waste.
                    reset=_no_reset,
                    **_statement_cache(self._pgbouncer),
                )
                if self._pgbouncer:
                    await self._warn_unless_timeouts_hold(pool)
                self._driver_pool = pool
            return self._driver_pool

    async def _warn_unless_timeouts_hold(self, pool: asyncpg.Pool) -> None:
        """Through PgBouncer the role's settings bound a statement and an idle transaction:
        say so once when they are looser than the gateway's (0 is no limit at all)."""
        names = sorted(self._expected_timeouts_ms)
        try:
            row = await pool.fetchrow(
                "SELECT " + ", ".join(f"current_setting('{name}') AS {name}" for name in names),
                timeout=self._statement_timeout_s,
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("database_session_timeouts_unchecked", error_type=type(exc).__name__)
            return
        looser = {}
        for name in names:
            found = _milliseconds(row[name])
            if found is None or found == 0 or found > self._expected_timeouts_ms[name]:
                looser[name] = row[name]
        if looser:
            log.warning(
                "database_session_timeouts_looser_than_settings",
                found=looser,
                expected_ms={name: self._expected_timeouts_ms[name] for name in looser},
                hint="behind PgBouncer set them on the gateway's role: see docs/operations.md#pgbouncer",
            )

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


def _statement_cache(pgbouncer: bool) -> dict[str, int]:
    """asyncpg's statement cache: off behind PgBouncer, where a named statement prepared in one
    transaction is missing (or another client's) in the next; asyncpg's default otherwise."""
    return {"statement_cache_size": 0} if pgbouncer else {}


_UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _milliseconds(shown: str) -> int | None:
    """A duration as ``SHOW`` and ``current_setting`` print it (``0``, ``250ms``, ``10s``, ``1min``)."""
    digits = shown.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = shown[len(digits):] or "ms"
    if not digits.isdigit() or unit not in _UNITS_MS:
        return None
    return int(digits) * _UNITS_MS[unit]


def create_engine(settings: Settings) -> AsyncEngine:
    if settings.database.url is None:
        raise SettingsError(
            "GATEWAY_DATABASE_URL is not set: `gateway` commands start the embedded PostgreSQL, "
            "an app built another way needs the URL"
        )
    engine = create_async_engine(
        engine_url(settings.database.url),
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
            **_statement_cache(settings.database.pgbouncer),
            # SQLAlchemy keeps prepared statements of its own: off too, so each statement is
            # prepared unnamed in its transaction (named ones, even uniquely named, would pile
            # up on PgBouncer's server sessions).
            **({"prepared_statement_cache_size": 0} if settings.database.pgbouncer else {}),
        },
    )
    event.listen(engine.sync_engine, "handle_error", _drop_row_values)
    event.listen(engine.sync_engine, "handle_error", _refused_connection_is_unavailable)
    return engine


def engine_url(url: str) -> sa.URL:
    """libpq's ``sslmode`` as asyncpg's ``ssl``: SQLAlchemy hands the query's parameters to
    ``asyncpg.connect`` as they are, and it takes the mode by that name."""
    parsed = sa.make_url(url)
    mode = parsed.query.get("sslmode")
    if mode is None:
        return parsed
    return parsed.difference_update_query(["sslmode"]).update_query_dict({"ssl": mode})


def _driver_dsn(url: sa.URL) -> str:
    """The engine's URL as a DSN for asyncpg's own pool, whose DSN parser knows ``sslmode``
    (and would send an unknown ``ssl`` to the server as a setting)."""
    url = url.set(drivername="postgresql")
    mode = url.query.get("ssl")
    if mode is not None:
        url = url.difference_update_query(["ssl"]).update_query_dict({"sslmode": mode})
    return url.render_as_string(hide_password=False)


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


def _refused_connection_is_unavailable(context: Any) -> None:
    """A server that refuses the connection itself (SQLSTATE class 08: PgBouncer refusing a
    startup parameter, too many clients) leaves the database unavailable, as an unreachable one
    does: the request answers 503, not 500. Refused startup parameters are a configuration
    error with one known cause, so the log names it."""
    seen: set[int] = set()
    current: BaseException | None = context.original_exception
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, asyncpg.PostgresConnectionError):
            context.is_disconnect = True
            if "unsupported startup parameter" in str(current.args[0] if current.args else ""):
                log.error(
                    "database_refused_session_settings",
                    sqlstate=current.sqlstate,
                    hint="a connection pooler refused the gateway's session settings: behind PgBouncer set "
                    "GATEWAY_DATABASE_PGBOUNCER=true (docs/operations.md#pgbouncer)",
                )
            return
        current = current.__cause__ or current.__context__
