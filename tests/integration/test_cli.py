"""`gateway ...` as an operator runs it, in a separate process."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import signal
import stat
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from gateway.db.embedded import ROOT_MANAGED_DIR_ENV, EmbeddedPostgres
from gateway.db.migrate import alembic_config
from gateway.db.models import Article, Role, RolePermission, Tenant, User
from tests.support import db
from tests.support.calls import batch, contents, tool_call
from tests.support.loopback import free_port
from tests.support.postgres import server_user_reaches_installed_binaries
from tests.support.tokens import TEST_SECRET, auth


def gateway(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], env=environ, cwd=cwd, capture_output=True, text=True, timeout=60
    )


async def counts(url: str) -> dict[str, int]:
    result = {}
    for model in (Tenant, Role, RolePermission, User, Article):
        result[model.__tablename__] = len(await db.rows(url, sa.select(model.__table__)))
    return result


async def test_gateway_token_mints_a_token_the_app_accepts(client):
    done = gateway("token", "--tenant", "acme", "--user", "bob", "--role", "editor", GATEWAY_JWT_SECRET=TEST_SECRET)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    response = await client.get("/v1/tools", headers=auth(token))
    assert response.status_code == 200 and "create_article" in response.text
    run = (await client.post("/v1/runs", headers=auth(token))).json()
    assert (run["tenant_id"], run["user_id"]) == ("acme", "bob")


async def test_gateway_token_takes_the_roles_from_the_directory_when_none_are_named(client, database_url):
    done = gateway("token", "--tenant", "acme", "--user", "alice",
                   GATEWAY_JWT_SECRET=TEST_SECRET, GATEWAY_DATABASE_URL=database_url)
    assert done.returncode == 0, done.stderr
    tools = (await client.get("/v1/tools", headers=auth(done.stdout.strip()))).json()["tools"]
    assert "add" in [t["function"]["name"] for t in tools]
    assert "create_article" not in [t["function"]["name"] for t in tools]


def test_gateway_token_without_a_secret_stops_with_a_clear_message(tmp_path):
    done = gateway("token", "--tenant", "acme", "--user", "bob", "--role", "editor", cwd=tmp_path)
    assert done.returncode == 2
    assert "GATEWAY_JWT_SECRET" in done.stderr and "Traceback" not in done.stderr


def test_gateway_serve_without_a_secret_stops_with_a_clear_message(tmp_path):
    done = gateway("serve", "--port", "1", cwd=tmp_path)
    assert done.returncode == 2
    assert "GATEWAY_JWT_SECRET" in done.stderr and "--demo" in done.stderr
    assert not (tmp_path / ".gateway").exists()  # stopped before starting a database


def test_gateway_token_refuses_a_lifetime_the_gateway_would_refuse(tmp_path):
    done = gateway("token", "--tenant", "acme", "--user", "bob", "--role", "editor", "--ttl", "86401",
                   cwd=tmp_path, GATEWAY_JWT_SECRET=TEST_SECRET)
    assert done.returncode == 2
    assert "GATEWAY_JWT_MAX_LIFETIME_S (86400)" in done.stderr and "Traceback" not in done.stderr


def test_gateway_serve_with_a_jwks_url_but_no_audience_or_issuer_stops_with_one_line_naming_them(tmp_path):
    done = gateway("serve", "--port", "1", cwd=tmp_path, GATEWAY_JWKS_URL="https://id.example/jwks",
                   GATEWAY_DATABASE_URL="postgresql+asyncpg://gateway@127.0.0.1:1/never")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "GATEWAY_JWT_AUDIENCE" in done.stderr and "GATEWAY_JWT_ISSUER" in done.stderr


def test_a_sqlite_url_stops_every_command_with_one_line_saying_what_to_do(tmp_path):
    for command in (["migrate"], ["serve", "--demo", "--port", "1"], ["tenants", "list"]):
        done = gateway(*command, cwd=tmp_path, GATEWAY_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path}/gateway.db")
        assert done.returncode == 2, command
        (line,) = done.stderr.splitlines()
        assert "PostgreSQL" in line and "unset GATEWAY_DATABASE_URL" in line, line
        assert "Traceback" not in done.stderr and not (tmp_path / "gateway.db").exists()


def test_gateway_seed_demo_is_idempotent(pg_url):
    url = pg_url
    first = gateway("seed-demo", GATEWAY_DATABASE_URL=url)
    assert first.returncode == 0, first.stderr
    after_first = asyncio.run(counts(url))
    second = gateway("seed-demo", GATEWAY_DATABASE_URL=url)
    assert second.returncode == 0, second.stderr
    assert asyncio.run(counts(url)) == after_first
    assert after_first["tenants"] == 2 and after_first["roles"] == 8 and after_first["users"] == 8
    assert after_first["articles"] == 4


def test_gateway_migrate_creates_the_schema(empty_pg_url):
    url = empty_pg_url
    done = gateway("migrate", GATEWAY_DATABASE_URL=url)
    assert done.returncode == 0, done.stderr
    assert asyncio.run(db.rows(url, sa.select(Tenant.__table__))) == []


def test_migrations_started_at_once_take_turns_and_all_succeed(empty_pg_url):
    # Two jobs (or serve and chat --demo started together) each migrating an empty database:
    # without a lock both apply 0001 and one dies on a table the other made.
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    environ["GATEWAY_DATABASE_URL"] = empty_pg_url
    processes = [
        subprocess.Popen([sys.executable, "-m", "gateway", "migrate"], env=environ, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = [(process.wait(timeout=120), process.stderr.read()) for process in processes]
    for process in processes:
        process.stdout.close()
        process.stderr.close()
    assert [code for code, _ in results] == [0, 0, 0], results
    [(version,)] = asyncio.run(db.rows(empty_pg_url, sa.text("SELECT version_num FROM alembic_version")))
    assert version == ScriptDirectory.from_config(alembic_config(empty_pg_url)).get_current_head()


def start_demo(folder: Path, port: int, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """``gateway serve --demo`` as the README's quick start runs it; its banner once it serves."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    environ.update(env)
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--demo", "--port", str(port)],
        cwd=folder, env=environ, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, "the demo server exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the demo server did not start"
        time.sleep(0.1)
    os.set_blocking(process.stdout.fileno(), False)
    return process, process.stdout.read().decode()


def stop_demo(process: subprocess.Popen[bytes], sig: int) -> None:
    process.send_signal(sig)
    try:
        assert process.wait(timeout=30) == (0 if sig == signal.SIGINT else -sig)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        process.stdout.close()


def test_gateway_serve_demo_prints_working_tokens_and_a_curl_line_and_keeps_its_data(reachable_tmp: Path):
    """The README quick start: the embedded PostgreSQL, the demo tenants, a token per user; a
    second start finds the tokens, runs and approvals of the first."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process, banner = start_demo(reachable_tmp, port)
    try:
        tokens = re.findall(r"^\s+(eyJ[\w-]+\.[\w-]+\.[\w-]+)$", banner, re.M)
        assert len(tokens) == 8  # alice, bob, carol, dave in acme and globex
        (curl,) = [line for line in banner.splitlines() if line.strip().startswith("curl ")]
        header = re.search(r"'Authorization: Bearer ([^']+)'", curl).group(1)
        listed = httpx.get(f"{base}/v1/tools", headers={"Authorization": f"Bearer {header}"}, timeout=5)
        assert listed.status_code == 200 and listed.json()["tools"]
        for token in tokens:
            assert httpx.post(f"{base}/v1/runs", headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 201
        bob = {"Authorization": f"Bearer {tokens[1]}"}
        run_id = httpx.post(f"{base}/v1/runs", headers=bob, timeout=5).json()["id"]
        call = tool_call("create_article", {"title": "Kept", "body": "across a restart"}, call_id="c1")
        answered = httpx.post(f"{base}/v1/runs/{run_id}/tool-calls", json=batch(call), headers=bob, timeout=10)
        (content,) = contents(answered.json())
        assert content["error"]["code"] == "APPROVAL_REQUIRED"
        approval_id = content["error"]["approval_id"]
        assert (reachable_tmp / ".gateway" / "postgres" / "PG_VERSION").exists()
        assert (reachable_tmp / ".gateway-demo-secret").stat().st_mode & 0o777 == 0o600
    finally:
        stop_demo(process, signal.SIGINT)  # Ctrl-C
    assert not EmbeddedPostgres(reachable_tmp / ".gateway" / "postgres").is_running()

    process, _ = start_demo(reachable_tmp, port)
    try:
        run = httpx.get(f"{base}/v1/runs/{run_id}", headers=bob, timeout=5)
        assert run.status_code == 200, run.text
        approval = httpx.get(f"{base}/v1/approvals/{approval_id}", headers=bob, timeout=5)
        assert approval.status_code == 200 and approval.json()["status"] == "pending", approval.text
    finally:
        stop_demo(process, signal.SIGTERM)  # a service manager; the exit status still says SIGTERM
    assert not EmbeddedPostgres(reachable_tmp / ".gateway" / "postgres").is_running()


def test_operator_commands_run_on_the_embedded_default_and_leave_no_server_behind(reachable_tmp: Path):
    data = reachable_tmp / ".gateway" / "postgres"
    steps = [
        (["migrate"], ""),
        (["tenants", "create", "initech"], "created tenant initech"),
        (["tenants", "list"], "initech"),
        (["audit", "seal"], "sealed 1 audit row(s)"),
        (["audit", "verify", "--tenant", "initech"], "tenant initech: OK"),
        (["seed-demo"], ""),
        (["token", "--demo", "--tenant", "acme", "--user", "bob"], "eyJ"),
    ]
    for command, expected in steps:
        done = gateway(*command, cwd=reachable_tmp)
        assert done.returncode == 0, (command, done.stderr)
        assert expected in done.stdout, (command, done.stdout)
        assert not EmbeddedPostgres(data).is_running(), command


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does the server run as a user who may be shut out")
def test_as_root_the_quick_start_in_a_private_folder_serves_and_later_commands_find_its_data(reachable_tmp: Path):
    """A project cloned into /root (mode 0700): the server's user cannot enter it, so the data
    lives in a root-managed folder, named in one line on the first start."""
    private = reachable_tmp / "private"
    private.mkdir(mode=0o700)
    project = private / "gateway"
    project.mkdir()
    managed = {ROOT_MANAGED_DIR_ENV: str(reachable_tmp / "managed")}  # stands in for /var/lib/gateway/embedded
    port = free_port()
    process, banner = start_demo(project, port, **managed)
    try:
        token = re.search(r"^\s+(eyJ[\w-]+\.[\w-]+\.[\w-]+)$", banner, re.M).group(1)
        created = httpx.post(f"http://127.0.0.1:{port}/v1/runs", headers=auth(token), timeout=5)
        assert created.status_code == 201, created.text
    finally:
        stop_demo(process, signal.SIGINT)
    data = project / ".gateway" / "postgres"
    assert data.is_symlink() and data.resolve().is_relative_to(reachable_tmp / "managed")
    assert not EmbeddedPostgres(data).is_running()

    listed = gateway("tenants", "list", cwd=project, **managed)
    assert listed.returncode == 0, listed.stderr
    assert "acme" in listed.stdout and "globex" in listed.stdout
    assert listed.stderr == ""  # the data's place was said once, by the first start
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


def test_a_data_folder_the_embedded_server_cannot_use_is_one_line_naming_it(reachable_tmp: Path):
    locked = reachable_tmp / "locked"
    locked.mkdir(mode=0o000)  # as root: its server user cannot enter; otherwise: we cannot write
    try:
        # As root, the root-managed folder would be the way out: make it unreachable too.
        done = gateway("tenants", "list", cwd=reachable_tmp, GATEWAY_EMBEDDED_DATA_DIR=str(locked / "pg" / "data"),
                       **{ROOT_MANAGED_DIR_ENV: str(locked / "managed")})
    finally:
        locked.chmod(0o700)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("gateway: ") and str(locked) in line and "Traceback" not in done.stderr
    # When the checkout itself is shut to the server's user, its binaries are what it names first.
    named = "GATEWAY_EMBEDDED_DATA_DIR" in line or "Permission denied" in line
    assert named or (not server_user_reaches_installed_binaries() and "its binaries" in line)
    assert not list(locked.iterdir())  # nothing made in a folder the server could not use


def test_gateway_tenants_approval_mode_lets_the_operator_bypass_approvals_for_one_tool(seeded_pg_url):
    done = gateway("tenants", "approval-mode", "acme", "create_article", "never", GATEWAY_DATABASE_URL=seeded_pg_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tenant acme, tool create_article (changes data): calls run without approval"
    query = sa.text("SELECT tenant_id, tool, approval_mode, updated_by FROM tool_policies")
    policies = asyncio.run(db.rows(seeded_pg_url, query))
    assert [tuple(row) for row in policies] == [("acme", "create_article", "never", "operator:cli")]

    unknown = gateway("tenants", "approval-mode", "acme", "no_such_tool", "never", GATEWAY_DATABASE_URL=seeded_pg_url)
    assert unknown.returncode == 1 and "no tool 'no_such_tool'" in unknown.stderr


@pytest.mark.parametrize("form", ["sslmode", "failover"])
def test_a_libpq_sslmode_or_several_hosts_in_the_database_url_reach_both_pools(empty_pg_url, form):
    # Operators write libpq's sslmode; asyncpg.connect takes it as ssl (SQLAlchemy passes the
    # query on as keyword arguments: sslmode was a TypeError on every connection). Several
    # hosts to try in turn, with the kind of server to settle on, reach both pools too.
    server, database = empty_pg_url.split("@", 1)[1].split("/", 1)
    url = (f"{empty_pg_url}?sslmode=prefer" if form == "sslmode" else
           f"postgresql+asyncpg://postgres@/{database}?host={server}&host={server}&target_session_attrs=read-write")
    done = gateway("migrate", GATEWAY_DATABASE_URL=url)
    assert done.returncode == 0, done.stderr

    async def both_pools() -> tuple[int, int]:
        async with db.open_database(url) as database:
            async with database.connect() as conn:
                engine_answer = (await conn.execute(sa.text("SELECT 1"))).scalar_one()
            async with database.driver() as conn:
                driver_answer = await conn.fetchval("SELECT 2")
        return engine_answer, driver_answer

    assert asyncio.run(both_pools()) == (1, 2)
    if form != "sslmode":
        return
    # This server speaks no TLS: requiring it is a refusal in one line, never a traceback.
    refused = gateway("migrate", GATEWAY_DATABASE_URL=f"{empty_pg_url}?sslmode=require")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert "rejected SSL upgrade" in line


def test_migrate_never_runs_a_migrations_folder_of_the_working_directory(tmp_path, empty_pg_url):
    # Installed as a wheel, the package has no migrations beside it; a migrations/env.py in
    # whatever folder the command runs from must not be run as code.
    import shutil

    import gateway as package

    site = tmp_path / "site"
    shutil.copytree(Path(package.__file__).parent, site / "gateway",
                    ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "cwd" / "migrations"
    planted.mkdir(parents=True)
    (planted / "env.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    environ.update(GATEWAY_DATABASE_URL=empty_pg_url, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-m", "gateway", "migrate"], env=environ, cwd=planted.parent,
                          capture_output=True, text=True, timeout=60)
    assert not (tmp_path / "ran").exists()
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert "GATEWAY_MIGRATIONS_DIR" in line
