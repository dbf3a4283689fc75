"""Building tool-call batches and reading the ``role=tool`` answers, as a client would."""

from __future__ import annotations

import json
from typing import Any

from litestar.testing import AsyncTestClient


def tool_call(call_id: str, name: str, arguments: dict[str, Any] | None = None, *, raw: Any = None) -> dict[str, Any]:
    """One entry of an assistant message's ``tool_calls``; ``raw`` sends ``arguments`` as given."""
    args = raw if raw is not None else json.dumps(arguments if arguments is not None else {})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def batch(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def code_of(content: dict[str, Any]) -> str:
    return "OK" if content["ok"] else content["error"]["code"]


async def create_run(client: AsyncTestClient, headers: dict[str, str], **limits: Any) -> dict[str, Any]:
    response = await client.post("/v1/runs", json=limits, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def send(
    client: AsyncTestClient, run_id: str, headers: dict[str, str], *calls: dict[str, Any]
) -> list[dict[str, Any]]:
    """POST a batch, check the answer's shape and order, and return each message's decoded content."""
    response = await client.post(f"/v1/runs/{run_id}/tool-calls", json=batch(*calls), headers=headers)
    assert response.status_code == 200, response.text
    messages = response.json()["messages"]
    assert [m["tool_call_id"] for m in messages] == [c["id"] for c in calls]
    assert all(m["role"] == "tool" for m in messages)
    return [json.loads(m["content"]) for m in messages]


async def send_one(
    client: AsyncTestClient, run_id: str, headers: dict[str, str], call_id: str, name: str,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    (content,) = await send(client, run_id, headers, tool_call(call_id, name, arguments))
    return content
