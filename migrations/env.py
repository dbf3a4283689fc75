"""Alembic environment: runs the migrations through the gateway's async engine.

The URL comes from the Alembic config's ``sqlalchemy.url`` when the gateway sets it
(``gateway migrate``, tests), else from ``GATEWAY_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import re

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.db.engine import engine_url
from gateway.db.models import Base
from gateway.settings import Settings

config = context.config
target_metadata = Base.metadata

# The monthly partitions of audit_events and its default partition are made by the database
# (gateway/db/sql/audit_partitions.sql), not by the models: autogenerate leaves them alone.
_AUDIT_PARTITION = re.compile(r"^audit_events_(p\d{4,}_\d{2}|default)$")


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    return not (type_ == "table" and name is not None and _AUDIT_PARTITION.match(name))


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url
    if url is None:
        raise SystemExit("GATEWAY_DATABASE_URL is not set; `gateway migrate` migrates the embedded PostgreSQL")
    return url


def run_migrations_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


MIGRATION_LOCK = 0x6761746577617921
"""The advisory lock every migrating process holds, from before Alembic reads the database's
revision until it is done: two processes migrating at once (``serve`` and ``chat --demo``
started together on the embedded server, two ``migrate`` jobs) take turns, and the second
finds the database at head instead of applying the same migration again."""


def do_run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_name=include_name,
        transaction_per_migration=True,
    )
    # Held by the session, past each migration's commit (PostgreSQL directly, not through a
    # transaction pooler: docs/operations.md).
    connection.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
    connection.commit()
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        try:
            if connection.in_transaction():
                connection.rollback()
            connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
            connection.commit()
        except Exception:  # noqa: BLE001, S110 - the connection broke: its session, and the lock, went with it
            pass


async def run_async_migrations() -> None:
    engine = create_async_engine(engine_url(database_url()), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        do_run_migrations(connectable)
        return
    asyncio.run(run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
