"""The hot path's SQL files (``gateway/db/sql/*.sql``), read as package data.

A migration applies a file with ``apply_sql_file``: every statement in a file is a
``CREATE OR REPLACE``, so applying it again is harmless. A later change to a function edits
its file and adds a migration that applies it again; the migrations that applied it before
stay as they are.

An earlier migration applies a file as it is now, written for a later schema, and the
later migration applies it again. So function bodies are checked when they run, not when
they are created (``check_function_bodies`` off, as ``pg_dump`` restores them), and a
migration that changes a function's arguments drops the old signature with ``IF EXISTS``.
The migration tests upgrade from every revision to head.
"""

from __future__ import annotations

from importlib import resources

from alembic import op
from sqlalchemy.util import await_only


def read_sql(name: str) -> str:
    """The text of ``gateway/db/sql/<name>``."""
    return resources.files("gateway.db.sql").joinpath(name).read_text(encoding="utf-8")


def apply_sql_file(name: str) -> None:
    """Execute one SQL file inside the running migration's transaction.

    The file goes to asyncpg as a simple query, as written: it may hold several statements
    (a function and its trigger), and nothing in it is read as a bound parameter."""
    driver = op.get_bind().connection.driver_connection
    await_only(driver.execute("SET LOCAL check_function_bodies = off;\n" + read_sql(name)))
