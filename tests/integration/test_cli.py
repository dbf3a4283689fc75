"""`gateway ...` as an operator runs it, in a separate process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.db.models import Article, Role, RolePermission, Tenant, User
from tests.support import db
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
