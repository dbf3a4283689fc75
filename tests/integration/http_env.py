"""A gateway and the business services its HTTP tools call, all real servers on loopback ports.

One environment per test module (they are slow to start relative to a
test); tests keep apart by using their own runs, users' orders and tool_call ids.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Litestar

from gateway.app import create_app
from gateway.db.engine import Database
from gateway.db.tenants import ensure_role
from gateway.demo import DEMO_TENANTS, seed_demo
from gateway.settings import Settings
from tests.conftest import _admin, make_settings
from tests.support.business_service import ServiceState, create_business_service, service_state
from tests.support.calls import batch, new_run, tool_call
from tests.support.loopback import ServerThread, free_port, loopback_socket
from tests.support.tokens import SERVICE_SIGNING_KEY, auth_for

TOOLS_TOML = """
[services.orders]
error_message_field = "detail"
error_message_max_chars = 60

# The same server, but it only accepts tokens for the audience "orders".
[services.billing]
audience = "billing"

[services.down]

[[tools]]
name = "whoami"
description = "Who the orders service thinks you are."
service = "orders"
permission = "orders:read"
request = { method = "GET", path = "/whoami" }
arguments = { type = "object", properties = {} }

[[tools]]
name = "get_order"
description = "Read one of your orders."
service = "orders"
permission = "orders:read"
request = { method = "GET", path = "/orders/{order_id}" }
arguments = { type = "object", required = ["order_id"], properties = { order_id = { type = "string", minLength = 1, maxLength = 80 } } }

[[tools]]
name = "create_order"
description = "Order an item."
service = "orders"
permission = "orders:write"
mutates = true
sensitive_fields = ["payment_token"]
request = { method = "POST", path = "/orders", body = ["item", "quantity", "payment_token"] }

[tools.arguments]
type = "object"
required = ["item", "quantity"]

[tools.arguments.properties]
item = { type = "string", minLength = 1 }
quantity = { type = "integer", minimum = 1 }
payment_token = { type = "string", pattern = "^tok_[a-z0-9]{8}$" }

[[tools]]
name = "cancel_order"
description = "Cancel one of your orders."
service = "orders"
permission = "orders:write"
mutates = true
request = { method = "POST", path = "/orders/{order_id}/cancel" }
arguments = { type = "object", required = ["order_id"], properties = { order_id = { type = "string" } } }

[[tools]]
name = "service_status"
description = "Ask the service for a given status."
service = "orders"
permission = "orders:read"
request = { method = "GET", path = "/status/{code}" }
arguments = { type = "object", required = ["code"], properties = { code = { type = "integer" } } }

[[tools]]
name = "check_card"
description = "Checks a card number (the service quotes it back when it refuses it)."
service = "orders"
permission = "orders:read"
sensitive_fields = ["card_number"]
request = { method = "GET", path = "/check-card", query = ["card_number", "code"] }
arguments = { type = "object", required = ["card_number"], properties = { card_number = { type = "string" }, code = { type = "integer" } } }

[[tools]]
name = "slow"
description = "Answers after a while."
service = "orders"
permission = "orders:read"
timeout_s = 0.3
request = { method = "GET", path = "/slow", query = ["ms"] }
arguments = { type = "object", properties = { ms = { type = "integer" } } }

[[tools]]
name = "big"
description = "Answers with a body of the given size."
service = "orders"
permission = "orders:read"
max_result_bytes = 1024
request = { method = "GET", path = "/big", query = ["size"] }
arguments = { type = "object", properties = { size = { type = "integer" } } }

[[tools]]
name = "endless"
description = "Answers with a body that never ends."
service = "orders"
permission = "orders:read"
max_result_bytes = 1024
timeout_s = 10
request = { method = "GET", path = "/endless" }

[[tools]]
name = "echo"
description = "Echoes a path value and a query value."
service = "orders"
permission = "orders:read"
request = { method = "GET", path = "/echo/{value}", query = ["q"] }
arguments = { type = "object", required = ["value"], properties = { value = { type = "string" }, q = { type = "string" } } }

[[tools]]
name = "redirect"
description = "Answers with a redirect."
service = "orders"
permission = "orders:read"
request = { method = "GET", path = "/redirect", query = ["to"] }
arguments = { type = "object", required = ["to"], properties = { to = { type = "string" } } }

[[tools]]
name = "billing_whoami"
description = "Calls the orders server as if it were the billing service."
service = "billing"
permission = "orders:read"
request = { method = "GET", path = "/whoami" }

[[tools]]
name = "unreachable"
description = "Calls a service that is down."
service = "down"
permission = "orders:read"
request = { method = "GET", path = "/whoami" }
"""

GRANTS = {
    "member": frozenset({"orders:read"}),
    "editor": frozenset({"orders:read", "orders:write"}),
    "admin": frozenset({"orders:read", "orders:write"}),
}


@dataclass
class HttpEnv:
    gateway_url: str
    gateway_app: Litestar
    settings: Settings
    service: ServiceState
    service_url: str
    trap: ServiceState
    trap_url: str
    trap_port: int


async def seed_with_grants(database_url: str, grants: dict[str, frozenset[str]]) -> None:
    """The demo tenants, each demo role also granted ``grants[role]`` (a tools file's permissions)."""
    db = Database.from_settings(Settings.from_flat(database_url=database_url))
    try:
        await seed_demo(db)
        async with db.begin() as conn:
            for tenant_id in DEMO_TENANTS:
                for role, permissions in grants.items():
                    await ensure_role(conn, tenant_id=tenant_id, name=role, description=role, permissions=permissions)
    finally:
        await db.dispose()


def _database(request: pytest.FixtureRequest) -> Iterator[str]:
    postgres = request.getfixturevalue("postgres")
    template_name = request.getfixturevalue("pg_template")
    name = f"gw_http_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _admin(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    try:
        yield postgres.sqlalchemy_url(name)
    finally:
        _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def http_env(request: pytest.FixtureRequest, **overrides: Any) -> Iterator[HttpEnv]:
    """Start everything; ``overrides`` change the gateway's settings."""
    databases = _database(request)
    database_url = next(databases)
    try:
        asyncio.run(seed_with_grants(database_url, GRANTS))
        gateway_sock = loopback_socket()
        jwks_url = f"http://127.0.0.1:{gateway_sock.getsockname()[1]}/.well-known/jwks.json"
        service_app = create_business_service(jwks_url=jwks_url)
        trap_app = create_business_service(jwks_url=jwks_url)
        tools_file = request.getfixturevalue("tmp_path_factory").mktemp("tools") / "tools.toml"
        tools_file.write_text(TOOLS_TOML)
        with ServerThread(service_app) as service, ServerThread(trap_app) as trap:
            settings = make_settings(
                database_url,
                tools_file=str(tools_file),
                service_base_urls=(
                    f"orders={service.url}/api",
                    f"billing={service.url}/api",
                    f"down=http://127.0.0.1:{free_port()}/api",
                ),
                service_signing_key=SERVICE_SIGNING_KEY,
                **overrides,
            )
            app = create_app(settings)
            with ServerThread(app, gateway_sock) as gateway:
                yield HttpEnv(
                    gateway_url=gateway.url,
                    gateway_app=app,
                    settings=settings,
                    service=service_state(service_app),
                    service_url=service.url,
                    trap=service_state(trap_app),
                    trap_url=trap.url,
                    trap_port=trap.port,
                )
    finally:
        databases.close()


class Caller:
    """Talks to the gateway like a client of the model would."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def new_run(self, user: str = "alice", tenant: str = "acme") -> str:
        return await new_run(self.client, user, tenant)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        user: str = "alice",
        tenant: str = "acme",
        run: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """One call in a fresh run (unless given); the decoded ``content`` of its message."""
        run = run or await self.new_run(user, tenant)
        raw = arguments if isinstance(arguments, str) else msgspec.json.encode(arguments or {}).decode()
        call = tool_call(tool, raw=raw)
        call_id = call["id"]
        response = await self.client.post(
            f"/v1/runs/{run}/tool-calls", headers={**auth_for(user, tenant), **(headers or {})}, json=batch(call)
        )
        assert response.status_code == 200, response.text
        message = response.json()["messages"][0]
        assert message["tool_call_id"] == call_id
        content: dict[str, Any] = msgspec.json.decode(message["content"])
        content["_raw"] = message["content"]
        content["_run"] = run
        content["_call_id"] = call_id
        return content
