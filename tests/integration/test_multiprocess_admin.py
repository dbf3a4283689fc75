"""Claims about several gateway processes, checked with real processes on one PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from gateway.audit.chain import audit_events, audit_links
from gateway.audit.verify import verify_chain
from gateway.db.engine import Database
from gateway.settings import Settings
from tests.conftest import seeded
from tests.support.processes import ROOT, gateway_env, gateways, run_cli
from tests.support.tokens import auth_for

pytestmark = pytest.mark.postgres

SEALER_LOOP = r"""
import asyncio, os, sys
from pathlib import Path
from gateway.audit.sealer import AuditSealer
from gateway.db.engine import Database
from gateway.settings import Settings

async def main(stop):
    db = Database.from_settings(Settings.from_env())
    sealer = AuditSealer(db, batch_size=20)
    total = turns = 0
    await sealer.seal_once(wait=False)
    print("ready", flush=True)
    try:
        for _ in range(3000):
            if stop.exists():
                break
            sealed = await sealer.seal_once(wait=False)
            if sealed:
                total += sealed
                turns += 1
            await asyncio.sleep(0.01)
    finally:
        await db.dispose()
    print(total, turns)

asyncio.run(main(Path(sys.argv[1])))
"""

_ids = itertools.count()


def _calls(n: int) -> dict:
    return {
        "tool_calls": [
            {"id": f"c{next(_ids)}", "type": "function",
             "function": {"name": "add", "arguments": json.dumps({"a": next(_ids), "b": 1})}}
            for _ in range(n)
        ]
    }


async def _new_run(http: httpx.AsyncClient, base: str, user: str, tenant: str, **limits: int) -> str:
    response = await http.post(f"{base}/v1/runs", json=limits or None, headers=auth_for(user, tenant))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def test_the_chain_stays_correct_with_concurrent_writers_and_sealers_on_several_processes(pg_url, tmp_path: Path):
    await seeded(pg_url)
    stop = tmp_path / "stop"
    with gateways(pg_url, 2, audit_seal_interval_s=0.2, audit_seal_batch_size=30, policy_cache_s=0) as procs:
        sealers = [
            subprocess.Popen([sys.executable, "-c", SEALER_LOOP, str(stop)], cwd=ROOT, env=gateway_env(pg_url),
                             stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        for sealer in sealers:
            assert sealer.stdout is not None and sealer.stdout.readline().strip() == "ready"
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                runs = [
                    (proc.url, user, tenant, await _new_run(http, proc.url, user, tenant))
                    for proc in procs for user in ("alice", "bob") for tenant in ("acme", "globex")
                ]
                limit = asyncio.Semaphore(16)

                async def one(i: int) -> None:
                    base, user, tenant, run = runs[i % len(runs)]
                    async with limit:
                        response = await http.post(
                            f"{base}/v1/runs/{run}/tool-calls", json=_calls(3), headers=auth_for(user, tenant)
                        )
                    assert response.status_code == 200, response.text

                await asyncio.gather(*(one(i) for i in range(96)))
        finally:
            stop.touch()
            outputs = [sealer.communicate(timeout=60)[0].split() for sealer in sealers]

    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        async with db.connect() as conn:
            sealed_before_final = await conn.scalar(
                sa.select(sa.func.count()).select_from(audit_links)
            )
        assert run_cli(pg_url, "audit", "seal").returncode == 0
        async with db.connect() as conn:
            for tenant in ("acme", "globex"):
                rows = await conn.scalar(sa.select(sa.func.count()).where(audit_events.c.tenant_id == tenant))
                report = await verify_chain(conn, tenant_id=tenant)
                assert report.ok, report.describe()
                assert (report.verified_rows, report.unsealed_rows) == (rows, 0)
                assert rows >= 96 * 3 // 2
    finally:
        await db.dispose()
    # The chain was built while writers ran, and the standalone sealers took turns too.
    assert sealed_before_final > 0
    assert sum(int(total) for total, _ in outputs) > 0


async def test_per_tool_cap_holds_under_concurrent_requests_on_two_processes(pg_url):
    """Needs the ledger to enforce CallPlan.tool_call_cap atomically."""
    await seeded(pg_url)
    with gateways(pg_url, 2, policy_cache_s=0, audit_seal_interval_s=0) as procs:
        async with httpx.AsyncClient(timeout=30) as http:
            put = await http.put(
                f"{procs[0].url}/v1/admin/tools/add", json={"max_calls_per_run": 5}, headers=auth_for("carol")
            )
            assert put.status_code == 200
            run = await _new_run(http, procs[0].url, "alice", "acme", max_tool_calls=100)

            async def one(i: int) -> str:
                base = procs[i % 2].url
                response = await http.post(f"{base}/v1/runs/{run}/tool-calls", json=_calls(1), headers=auth_for())
                content = json.loads(response.json()["messages"][0]["content"])
                return "OK" if content["ok"] else content["error"]["code"]

            outcomes = await asyncio.gather(*(one(i) for i in range(20)))
    assert outcomes.count("OK") == 5
    assert outcomes.count("BUDGET_EXCEEDED") == 15


async def test_a_policy_change_reaches_another_process_within_the_cache_time(pg_url):
    await seeded(pg_url)
    cache_s = 1.0
    with gateways(pg_url, 2, policy_cache_s=cache_s, audit_seal_interval_s=0) as (a, b):
        async with httpx.AsyncClient(timeout=10) as http:

            async def names(base: str) -> list[str]:
                response = await http.get(f"{base}/v1/tools", headers=auth_for("alice"))
                return [t["function"]["name"] for t in response.json()["tools"]]

            assert "add" in await names(b.url)  # b has the tenant cached now
            put = await http.put(f"{a.url}/v1/admin/tools/add", json={"enabled": False}, headers=auth_for("carol"))
            assert put.status_code == 200
            assert "add" not in await names(a.url)  # at once where the change was made

            changed_at = time.monotonic()
            while "add" in await names(b.url):
                assert time.monotonic() - changed_at < cache_s + 5, "the other process kept a stale policy"
                await asyncio.sleep(0.1)
            run = await _new_run(http, b.url, "alice", "acme")
            response = await http.post(f"{b.url}/v1/runs/{run}/tool-calls", json=_calls(1), headers=auth_for())
            assert json.loads(response.json()["messages"][0]["content"])["error"]["code"] == "PERMISSION_DENIED"


async def test_operator_cli_manages_tenants_and_a_disabled_tenants_tokens_are_refused(pg_url):
    await seeded(pg_url)
    created = run_cli(pg_url, "tenants", "create", "initech", "--name", "Initech")
    assert created.returncode == 0, created.stderr
    again = run_cli(pg_url, "tenants", "create", "initech")
    assert again.returncode == 1 and "already exists" in again.stderr
    assert run_cli(pg_url, "tenants", "create", "Bad Slug").returncode == 1

    with gateways(pg_url, 1, policy_cache_s=0.5, audit_seal_interval_s=0) as (gateway,):
        async with httpx.AsyncClient(timeout=10) as http:
            admin = auth_for("root", "initech", roles=["admin"])
            roles = await http.get(f"{gateway.url}/v1/admin/roles", headers=admin)
            assert [r["name"] for r in roles.json()["items"]] == ["admin"]

            async def status() -> tuple[int, str | None]:
                response = await http.get(f"{gateway.url}/v1/tools", headers=auth_for("alice", "acme"))
                return response.status_code, response.json().get("error", {}).get("code")

            assert await status() == (200, None)
            disabled = run_cli(pg_url, "tenants", "disable", "acme")
            assert disabled.returncode == 0 and "disabled" in disabled.stdout
            listed = run_cli(pg_url, "tenants", "list").stdout
            assert any(line.split()[:2] == ["acme", "disabled"] for line in listed.splitlines())
            assert any(line.split()[:2] == ["initech", "enabled"] for line in listed.splitlines())

            deadline = time.monotonic() + 10
            while await status() != (403, "TENANT_DISABLED"):
                assert time.monotonic() < deadline, "a disabled tenant's token was still accepted"
                await asyncio.sleep(0.1)
            other = await http.get(f"{gateway.url}/v1/tools", headers=auth_for("alice", "globex"))
            assert other.status_code == 200

            assert run_cli(pg_url, "tenants", "enable", "acme").returncode == 0
            deadline = time.monotonic() + 10
            while await status() != (200, None):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)

    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        async with db.connect() as conn:
            actions = list((await conn.execute(
                sa.select(audit_events.c.detail).where(audit_events.c.tenant_id == "acme",
                                                       audit_events.c.kind == "admin_change")
                .order_by(audit_events.c.id)
            )).scalars())
        assert [a["action"] for a in actions] == ["tenant.disable", "tenant.enable"]
        assert actions[0]["before"] == {"disabled": False} and actions[0]["after"] == {"disabled": True}
    finally:
        await db.dispose()


EU_VLLM = '[{"name": "eu-vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}]'


async def test_operator_cli_configures_a_tenants_agent_loop_and_running_processes_honour_it(pg_url):
    await seeded(pg_url)
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "mine", "parameters": {"type": "object"}}}]}
    with gateways(pg_url, 1, policy_cache_s=0.5, audit_seal_interval_s=0) as (gateway,):
        async with httpx.AsyncClient(timeout=10) as http:

            async def code() -> str:
                response = await http.post(f"{gateway.url}/v1/chat/completions", json=chat,
                                           headers=auth_for("alice", "acme"))
                return response.json()["error"]["code"]

            assert await code() == "CLIENT_TOOLS_NOT_ALLOWED"
            # The command checks the name against its own settings; this gateway has no eu-vllm.
            typo = run_cli(pg_url, "tenants", "configure", "acme", "--llm-provider", "eu-vlm",
                           llm_providers=EU_VLLM)
            assert typo.returncode == 1 and "no model provider 'eu-vlm' is configured (configured: eu-vllm)" in (
                typo.stderr)
            allowed = run_cli(pg_url, "tenants", "configure", "acme", "--client-tools", "allow",
                              "--llm-provider", "eu-vllm", llm_providers=EU_VLLM)
            assert allowed.returncode == 0, allowed.stderr
            assert "model provider eu-vllm; client tools allowed" in allowed.stdout
            # Past the client-tools check, the pinned provider is not configured on this gateway.
            deadline = time.monotonic() + 10
            while await code() != "MODEL_NOT_CONFIGURED":
                assert time.monotonic() < deadline, "the running process kept refusing client tools"
                await asyncio.sleep(0.1)
            # The tenant's administrators see the settings, and cannot change them.
            tenant = await http.get(f"{gateway.url}/v1/admin/tenant", headers=auth_for("carol", "acme"))
            assert tenant.json()["agent_loop"] == {"llm_provider": "eu-vllm", "allow_client_tools": True}
            refused = await http.patch(f"{gateway.url}/v1/admin/tenant", json={"agent_loop": {}},
                                       headers=auth_for("carol", "acme"))
            assert refused.status_code == 400

    listed = run_cli(pg_url, "tenants", "list").stdout.splitlines()
    assert listed[0].split()[-5:] == ["llm", "provider", "client", "tools", "name"]
    (acme,) = [line.split() for line in listed if line.startswith("acme ")]
    assert acme[5:7] == ["eu-vllm", "allow"]
    (globex,) = [line.split() for line in listed if line.startswith("globex ")]
    assert globex[5:7] == ["-", "refuse"]

    unpinned = run_cli(pg_url, "tenants", "configure", "acme", "--no-llm-provider")
    assert unpinned.returncode == 0 and "none pinned); client tools allowed" in unpinned.stdout
    nothing = run_cli(pg_url, "tenants", "configure", "acme")
    assert nothing.returncode == 1 and "say what to change" in nothing.stderr
    unknown = run_cli(pg_url, "tenants", "configure", "initech", "--client-tools", "refuse")
    assert unknown.returncode == 1 and "no tenant 'initech'" in unknown.stderr
    bad_name = run_cli(pg_url, "tenants", "configure", "acme", "--llm-provider", "a b")
    assert bad_name.returncode == 1 and "not a provider name" in bad_name.stderr
    both = run_cli(pg_url, "tenants", "configure", "acme", "--llm-provider", "x", "--no-llm-provider")
    assert both.returncode == 2 and "not allowed with" in both.stderr

    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        async with db.connect() as conn:
            row = (await conn.execute(sa.text(
                "SELECT llm_provider, allow_client_tools FROM tenants WHERE id = 'acme'"))).one()
            assert (row.llm_provider, bool(row.allow_client_tools)) == (None, True)
            changes = list((await conn.execute(
                sa.select(audit_events.c.user_id, audit_events.c.detail)
                .where(audit_events.c.tenant_id == "acme", audit_events.c.kind == "admin_change")
                .order_by(audit_events.c.id)
            )).all())
        assert [(c.user_id, c.detail["action"]) for c in changes] == [("operator:cli", "tenant.configure")] * 2
        assert changes[0].detail["before"] == {"llm_provider": None, "allow_client_tools": False}
        assert changes[0].detail["after"] == {"llm_provider": "eu-vllm", "allow_client_tools": True}
        assert changes[1].detail["after"] == {"llm_provider": None, "allow_client_tools": True}
    finally:
        await db.dispose()
