"""The agent loop against a scripted model: both are real HTTP servers on loopback ports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
import sqlalchemy as sa

from gateway.app import create_app
from gateway.db.tenants import set_agent_settings
from gateway.errors import BusinessRuleViolation
from gateway.settings import Settings
from gateway.tools.base import ToolContext, struct_tool
from gateway.tools.builtin import CALCULATOR_USE, NoArguments, builtin_tools
from gateway.tools.registry import ToolRegistry
from tests.conftest import make_settings, seeded
from tests.support.db import open_database, rows
from tests.support.loopback import serve
from tests.support.scripted_model import ScriptedModel
from tests.support.tokens import auth_for

LEAKY_SECRET = "postgresql://admin:hunter2@db.internal:5432/prod"


class SleepArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    seconds: float


@struct_tool(name="explode", description="Always fails unexpectedly.", arguments=NoArguments,
             permission=CALCULATOR_USE)
async def explode(ctx: ToolContext, args: NoArguments) -> object:
    raise RuntimeError(f"could not connect to {LEAKY_SECRET}")


@struct_tool(name="nothing", description="Runs and returns nothing.", arguments=NoArguments,
             permission=CALCULATOR_USE)
async def nothing(ctx: ToolContext, args: NoArguments) -> object:
    return None


@struct_tool(name="sleep", description="Sleeps.", arguments=SleepArgs, permission=CALCULATOR_USE, timeout_s=30)
async def sleep(ctx: ToolContext, args: SleepArgs) -> object:
    import asyncio

    await asyncio.sleep(args.seconds)
    return "slept"


@struct_tool(name="refuse", description="Refuses by a business rule.", arguments=NoArguments,
             permission=CALCULATOR_USE)
async def refuse(ctx: ToolContext, args: NoArguments) -> object:
    raise BusinessRuleViolation("Never on a Sunday.")


def agent_registry() -> ToolRegistry:
    return ToolRegistry([*builtin_tools(), explode, nothing, sleep, refuse])


def agent_settings(database_url: str, model_url: str, *, kind: str = "openai", **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "llm_kind": kind,
        "llm_base_url": model_url + "/v1" if kind == "openai" else model_url,
        "llm_model": "scripted-model",
        "llm_retry_backoff_s": 0.01,
        "llm_timeout_s": 5.0,
        "run_timeout_s": 20.0,
    }
    values.update(overrides)
    return make_settings(database_url, **values)


@dataclass
class Gateway:
    url: str
    http: httpx.AsyncClient
    settings: Settings
    database_url: str

    async def chat(self, content: str | list[dict[str, Any]], *, user: str = "alice", tenant: str = "acme",
                   **body: Any) -> httpx.Response:
        messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
        payload = {"model": "default", "messages": messages, **body}
        return await self.http.post("/v1/chat/completions", json=payload, headers=auth_for(user, tenant))

    async def run(self, run_id: str, *, user: str = "alice", tenant: str = "acme") -> dict[str, Any]:
        response = await self.http.get(f"/v1/runs/{run_id}", headers=auth_for(user, tenant))
        assert response.status_code == 200, response.text
        return response.json()

    async def set_tenant(self, tenant: str, *, allow_client_tools: bool = False, llm_provider: str | None = None) -> None:
        async with open_database(self.database_url) as db, db.begin() as conn:
            assert await set_agent_settings(conn, tenant_id=tenant, allow_client_tools=allow_client_tools,
                                            llm_provider=llm_provider)

    async def sql(self, statement: str, **params: Any) -> list[Any]:
        return await rows(self.database_url, sa.text(statement).bindparams(**params))


@asynccontextmanager
async def running_gateway(database_url: str, settings: Settings) -> AsyncIterator[Gateway]:
    await seeded(database_url)
    app = create_app(settings, registry=agent_registry())
    async with serve(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60.0)) as http:
            yield Gateway(url=url, http=http, settings=settings, database_url=database_url)


@asynccontextmanager
async def served_model() -> AsyncIterator[ScriptedModel]:
    """A scripted model on a loopback port, its ``url`` set."""
    scripted = ScriptedModel()
    async with serve(scripted) as url:
        scripted.url = url
        yield scripted


@pytest.fixture
async def model() -> AsyncIterator[ScriptedModel]:
    async with served_model() as scripted:
        yield scripted


@pytest.fixture
def gateway_overrides() -> dict[str, Any]:
    """Override in a test module (or parametrize) to change the gateway's settings."""
    return {}


@pytest.fixture
async def gateway(pg_url: str, model: ScriptedModel, gateway_overrides: dict[str, Any]) -> AsyncIterator[Gateway]:
    async with running_gateway(pg_url, agent_settings(pg_url, model.url, **gateway_overrides)) as gw:
        yield gw


@pytest.fixture
async def gateway_any_db(
    database_url: str, model: ScriptedModel, gateway_overrides: dict[str, Any]
) -> AsyncIterator[Gateway]:
    """The same, on a database the demo tenants were already seeded in."""
    async with running_gateway(database_url, agent_settings(database_url, model.url, **gateway_overrides)) as gw:
        yield gw


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


def decoded(content: str) -> Any:
    return msgspec.json.decode(content)


Responder = Callable[[dict[str, Any]], Any]
