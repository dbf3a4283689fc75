"""Small helpers for driving runs and tool calls through the HTTP API."""

from __future__ import annotations

import itertools
import json
from typing import Any

from tests.support.tokens import auth_for

_ids = itertools.count(1)


def tool_call(name: str, arguments: dict[str, Any] | None = None, *, call_id: str | None = None) -> dict[str, Any]:
    return {
        "id": call_id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments or {})},
    }


async def new_run(client: Any, user: str = "alice", tenant: str = "acme", **limits: Any) -> str:
    response = await client.post("/v1/runs", json=limits or None, headers=auth_for(user, tenant))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def call_tools(
    client: Any, run_id: str, calls: list[dict[str, Any]], user: str = "alice", tenant: str = "acme"
) -> list[dict[str, Any]]:
    """The decoded ``content`` of each ``role=tool`` message, in order."""
    response = await client.post(
        f"/v1/runs/{run_id}/tool-calls", json={"tool_calls": calls}, headers=auth_for(user, tenant)
    )
    assert response.status_code == 200, response.text
    return [json.loads(m["content"]) for m in response.json()["messages"]]


async def tool_names(client: Any, user: str = "alice", tenant: str = "acme") -> list[str]:
    response = await client.get("/v1/tools", headers=auth_for(user, tenant))
    assert response.status_code == 200, response.text
    return [t["function"]["name"] for t in response.json()["tools"]]


async def set_policy(client: Any, tool: str, policy: dict[str, Any], tenant: str = "acme") -> dict[str, Any]:
    response = await client.put(f"/v1/admin/tools/{tool}", json=policy, headers=auth_for("carol", tenant))
    assert response.status_code == 200, response.text
    return dict(response.json())


def error_code(content: dict[str, Any]) -> str | None:
    return content["error"]["code"] if not content["ok"] else None
