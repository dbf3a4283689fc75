"""Runs and tool calls as a client makes them: building a batch, posting it, reading the
``role=tool`` answers; and the tools and policies a caller sees."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.support.tokens import auth_for


def tool_call(
    name: str, arguments: dict[str, Any] | None = None, *, call_id: str | None = None, raw: Any = None
) -> dict[str, Any]:
    """One entry of an assistant message's ``tool_calls``; ``raw`` sends ``arguments`` as given."""
    args = raw if raw is not None else json.dumps(arguments if arguments is not None else {})
    return {
        "id": call_id if call_id is not None else "call_" + uuid.uuid4().hex[:12],
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def batch(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def contents(response_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoded ``content`` of each ``role=tool`` message, in order."""
    return [json.loads(message["content"]) for message in response_json["messages"]]


def outcome(content: dict[str, Any]) -> str:
    """``OK``, or the error code the model was given."""
    return "OK" if content["ok"] else content["error"]["code"]


async def create_run(client: Any, headers: dict[str, str], **limits: Any) -> dict[str, Any]:
    response = await client.post("/v1/runs", json=limits, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def new_run(client: Any, user: str = "alice", tenant: str = "acme", **limits: Any) -> str:
    """The id of a new run of ``user`` in ``tenant``."""
    return str((await create_run(client, auth_for(user, tenant), **limits))["id"])


async def send(client: Any, run_id: str, headers: dict[str, str], *calls: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a batch, check the answer's shape and order, and return each message's decoded content."""
    response = await client.post(f"/v1/runs/{run_id}/tool-calls", json=batch(*calls), headers=headers)
    assert response.status_code == 200, response.text
    messages = response.json()["messages"]
    assert [m["tool_call_id"] for m in messages] == [c["id"] for c in calls]
    assert all(m["role"] == "tool" for m in messages)
    return contents(response.json())


async def send_one(
    client: Any, run_id: str, headers: dict[str, str], call_id: str, name: str,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    (content,) = await send(client, run_id, headers, tool_call(name, arguments, call_id=call_id))
    return content


async def call_tools(
    client: Any, run_id: str, calls: list[dict[str, Any]], user: str = "alice", tenant: str = "acme"
) -> list[dict[str, Any]]:
    """``send`` as ``user`` of ``tenant``."""
    return await send(client, run_id, auth_for(user, tenant), *calls)


async def tool_names(client: Any, user: str = "alice", **claims: Any) -> list[str]:
    """The names of the tools ``GET /v1/tools`` lists for ``user`` (``tenant``, ``roles``: see ``auth_for``)."""
    response = await client.get("/v1/tools", headers=auth_for(user, **claims))
    assert response.status_code == 200, response.text
    return [t["function"]["name"] for t in response.json()["tools"]]


async def set_policy(client: Any, tool: str, policy: dict[str, Any], tenant: str = "acme") -> dict[str, Any]:
    response = await client.put(f"/v1/admin/tools/{tool}", json=policy, headers=auth_for("carol", tenant))
    assert response.status_code == 200, response.text
    return dict(response.json())
