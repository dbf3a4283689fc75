"""A real PgBouncer (Debian's ``pgbouncer``) in transaction pooling mode on a free loopback
port, in front of the suite's PostgreSQL; each test starts its own and stops it. The config is
the one docs/operations.md tells operators to use."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.support.loopback import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"


def pgbouncer_binary() -> str:
    """The installed PgBouncer; its absence fails the test (.ci/run installs it)."""
    found = shutil.which("pgbouncer") or (PGBOUNCER if os.access(PGBOUNCER, os.X_OK) else None)
    if found is None:
        raise RuntimeError("PgBouncer is not installed: `apt-get install pgbouncer` (.ci/run does it)")
    return found


@dataclass
class PgBouncer:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def url(self, database_url: str) -> str:
        """``database_url`` (a PostgreSQL URL of the suite's server) through this PgBouncer."""
        parts = urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        # An embedded server is named by a socket folder in the query: PgBouncer is on TCP.
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")])
        return urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{self.port}", query=query))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def server_address(server_dsn: str) -> tuple[str, int]:
    """Host (or Unix socket folder, for the embedded server) and port of the suite's server."""
    server = urlsplit(server_dsn)
    query = dict(parse_qsl(server.query))
    return query.get("host") or server.hostname or "127.0.0.1", int(query.get("port") or server.port or 5432)


def config(*, port: int, server_dsn: str, auth_file: Path, pool_size: int) -> str:
    host, server_port = server_address(server_dsn)
    return f"""\
[databases]
* = host={host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {auth_file}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 500
server_reset_query =
ignore_startup_parameters =
"""


def _unprivileged_user(server_dsn: str) -> str:
    host, _ = server_address(server_dsn)
    if host.startswith("/"):
        return pwd.getpwuid(Path(host).stat().st_uid).pw_name
    return "nobody"


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def pgbouncer(server_dsn: str, *, pool_size: int = 5, timeout: float = 20) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the server of ``server_dsn``, its user trusted
    (as the suite's PostgreSQL trusts it); stopped when the block ends."""
    binary = pgbouncer_binary()
    user = urlsplit(server_dsn).username or "postgres"
    with tempfile.TemporaryDirectory(prefix="gateway-pgbouncer-") as folder:
        root = Path(folder)
        root.chmod(0o755)  # as root, PgBouncer runs as `nobody`, who must read its config
        auth_file = root / "users.txt"
        auth_file.write_text(f'"{user}" ""\n')
        port = free_port()
        ini = root / "pgbouncer.ini"
        ini.write_text(config(port=port, server_dsn=server_dsn, auth_file=auth_file, pool_size=pool_size))
        for path in (auth_file, ini):
            path.chmod(0o644)
        # PgBouncer refuses to run as root: drop to an unprivileged user then (the owner of the
        # embedded server's private socket folder, so that it can connect).
        args = [binary, *(["-u", _unprivileged_user(server_dsn)] if os.geteuid() == 0 else []), str(ini)]
        log_path = root / "pgbouncer.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        bouncer = PgBouncer(port=port, process=process, log_path=log_path)
        try:
            deadline = time.monotonic() + timeout
            while not _listening(port):
                if process.poll() is not None:
                    raise RuntimeError(f"pgbouncer exited with {process.returncode}:\n{bouncer.log()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not listen on {port}:\n{bouncer.log()}")
                time.sleep(0.05)
            yield bouncer
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
