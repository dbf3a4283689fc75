"""Find a PostgreSQL server for the test suite, or start a throwaway one.

In order: ``GATEWAY_TEST_DATABASE_URL`` when set; else a server answering on
127.0.0.1:5432; else a cluster made with the local ``initdb``/``pg_ctl`` in a temporary
folder (removed afterwards); else stop with a message saying how to install PostgreSQL.
The PostgreSQL tests are never skipped.
"""

from __future__ import annotations

import asyncio
import getpass
import glob
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from tests.support.loopback import free_port

INSTALL_HINT = (
    "The test suite needs PostgreSQL and found none: GATEWAY_TEST_DATABASE_URL is not set, nothing answers "
    "on 127.0.0.1:5432, and no initdb/pg_ctl was found to start a throwaway cluster.\n"
    "Install PostgreSQL (Debian/Ubuntu: `apt-get install postgresql`; macOS: `brew install postgresql@16`) "
    "or point GATEWAY_TEST_DATABASE_URL at a server, e.g. postgresql://postgres@127.0.0.1:5432/postgres"
)


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

    binaries = _find_pg_binaries()
    if binaries is None:
        raise PostgresUnavailable(INSTALL_HINT)
    return start_throwaway_cluster(binaries)


class PostgresUnavailable(RuntimeError):
    pass


def _safe(dsn: str) -> str:
    parts = urlsplit(dsn)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _find_pg_binaries() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True) + sorted(
        glob.glob("/usr/local/opt/postgresql*/bin")
    ):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


@dataclass
class ThrowawayCluster:
    """A cluster in a temporary folder that a test may stop and start again (``pg_ctl``)."""

    bin_dir: Path
    workdir: Path
    port: int
    run_as: list[str]
    env: dict[str, str]

    @property
    def data(self) -> Path:
        return self.workdir / "data"

    @property
    def log_file(self) -> Path:
        return self.workdir / "postgres.log"

    def pg_ctl(self, *args: str, check: bool = True) -> None:
        subprocess.run(
            [*self.run_as, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args],
            check=check, capture_output=True, env=self.env, timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self.pg_ctl("-l", str(self.log_file), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect every client, as an outage or a failover would)."""
        self.pg_ctl("-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.pg_ctl("-m", "immediate", "stop", check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)


def init_throwaway_cluster(bin_dir: Path) -> ThrowawayCluster:
    """initdb + pg_ctl start in a temporary folder; as root, the cluster runs as user postgres."""
    workdir = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        if runuser is None:
            raise PostgresUnavailable("Running as root without `runuser`: cannot start PostgreSQL as another user.")
        run_as = [runuser, "-u", "postgres", "--"]
        shutil.chown(workdir, user="postgres")
    cluster = ThrowawayCluster(
        bin_dir=bin_dir, workdir=workdir, port=free_port(), run_as=run_as, env={**os.environ, "LC_ALL": "C"}
    )
    subprocess.run(
        [*run_as, str(bin_dir / "initdb"), "-D", str(cluster.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
         "--no-sync"],
        check=True, capture_output=True, env=cluster.env,
    )
    cluster.start()
    return cluster


def start_throwaway_cluster(bin_dir: Path) -> PostgresServer:
    """initdb + pg_ctl start in a temporary folder; as root, the cluster runs as user postgres."""
    cluster = init_throwaway_cluster(bin_dir)
    server = PostgresServer(
        admin_dsn=f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres", origin="throwaway cluster"
    )
    server._cleanup.append(cluster.remove)
    deadline = time.monotonic() + 30
    while not _answers(server.admin_dsn, timeout=2):
        if time.monotonic() > deadline:
            cluster.remove()
            raise PostgresUnavailable(f"the throwaway PostgreSQL cluster did not start; see {cluster.log_file}")
        time.sleep(0.2)
    return server


def find_pg_binaries() -> Path | None:
    """The folder of the local ``initdb`` and ``pg_ctl``, if PostgreSQL is installed."""
    return _find_pg_binaries()
