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


def do_run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_name=include_name,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = create_async_engine(database_url(), poolclass=pool.NullPool)
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
