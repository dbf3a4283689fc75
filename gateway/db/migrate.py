"""Apply the Alembic migrations: the only way the schema is made, in tests and in production."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config

import gateway
from gateway.settings import SettingsError


def migrations_dir() -> Path:
    """The project's ``migrations/``: named by ``GATEWAY_MIGRATIONS_DIR``, else beside the
    package (a checkout, an editable install). Never the working directory's: a
    ``migrations/env.py`` wherever the command happens to run would be run as code."""
    candidates = [
        os.environ.get("GATEWAY_MIGRATIONS_DIR"),
        Path(gateway.__file__).resolve().parent.parent / "migrations",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "env.py").is_file():
            return Path(candidate)
    raise SettingsError(
        "cannot find the migrations folder beside the gateway package; set GATEWAY_MIGRATIONS_DIR to the "
        "project's migrations/"
    )


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("path_separator", "os")
    # ConfigParser interpolation: a literal % in a URL (an encoded password) must be doubled.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_to_head(database_url: str) -> None:
    """Run ``alembic upgrade head``; blocking, so call it outside the event loop (or in a thread)."""
    command.upgrade(alembic_config(database_url), "head")


def check_models_match(database_url: str) -> None:
    """Raise when the models and the migrated schema disagree (``alembic check``)."""
    command.check(alembic_config(database_url))
