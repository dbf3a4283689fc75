"""`gateway ...` as an operator runs it, in a separate process."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from gateway.db.models import Article, Role, RolePermission, Tenant, User
from tests.support import db
from tests.support.loopback import free_port
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
    done = gateway("serve", "--port", "1", cwd=tmp_path, GATEWAY_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path}/g.db")
    assert done.returncode == 2
    assert "GATEWAY_JWT_SECRET" in done.stderr and "--demo" in done.stderr


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


@pytest.mark.parametrize("backend", ["sqlite_url", "pg_url"])
def test_gateway_seed_demo_is_idempotent(request, backend):
    url = request.getfixturevalue(backend)
    first = gateway("seed-demo", GATEWAY_DATABASE_URL=url)
    assert first.returncode == 0, first.stderr
    after_first = asyncio.run(counts(url))
    second = gateway("seed-demo", GATEWAY_DATABASE_URL=url)
    assert second.returncode == 0, second.stderr
    assert asyncio.run(counts(url)) == after_first
    assert after_first["tenants"] == 2 and after_first["roles"] == 6 and after_first["users"] == 6
    assert after_first["articles"] == 4


def test_gateway_migrate_creates_the_schema(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'migrated.db'}"
    done = gateway("migrate", GATEWAY_DATABASE_URL=url)
    assert done.returncode == 0, done.stderr
    assert asyncio.run(db.rows(url, sa.select(Tenant.__table__))) == []


def test_gateway_serve_demo_prints_working_tokens_and_a_curl_line(tmp_path):
    """The README quick start: an embedded SQLite file, the demo tenants, a token per user."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--demo", "--port", str(port)],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "the demo server exited"
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the demo server did not start"
            time.sleep(0.1)
        os.set_blocking(process.stdout.fileno(), False)
        banner = process.stdout.read().decode()
        tokens = re.findall(r"^\s+(eyJ[\w-]+\.[\w-]+\.[\w-]+)$", banner, re.M)
        assert len(tokens) == 6  # alice, bob, carol in acme and globex
        (curl,) = [line for line in banner.splitlines() if line.strip().startswith("curl ")]
        header = re.search(r"'Authorization: Bearer ([^']+)'", curl).group(1)
        listed = httpx.get(f"{base}/v1/tools", headers={"Authorization": f"Bearer {header}"}, timeout=5)
        assert listed.status_code == 200 and listed.json()["tools"]
        for token in tokens:
            assert httpx.post(f"{base}/v1/runs", headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 201
        assert (tmp_path / "gateway.db").exists()
        assert (tmp_path / ".gateway-demo-secret").stat().st_mode & 0o777 == 0o600
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        process.stdout.close()


def test_gateway_tenants_approval_mode_lets_the_operator_bypass_approvals_for_one_tool(seeded_pg_url):
    done = gateway("tenants", "approval-mode", "acme", "create_article", "never", GATEWAY_DATABASE_URL=seeded_pg_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tenant acme, tool create_article (changes data): calls run without approval"
    query = sa.text("SELECT tenant_id, tool, approval_mode, updated_by FROM tool_policies")
    policies = asyncio.run(db.rows(seeded_pg_url, query))
    assert [tuple(row) for row in policies] == [("acme", "create_article", "never", "operator:cli")]

    unknown = gateway("tenants", "approval-mode", "acme", "no_such_tool", "never", GATEWAY_DATABASE_URL=seeded_pg_url)
    assert unknown.returncode == 1 and "no tool 'no_such_tool'" in unknown.stderr
