"""Building tool-call batches and reading their answers, for tests."""

from __future__ import annotations

import json
import uuid
from typing import Any


def call(name: str, arguments: dict[str, Any] | None = None, call_id: str | None = None) -> dict[str, Any]:
    return {
        "id": call_id or "call_" + uuid.uuid4().hex[:12],
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments or {})},
    }


def batch(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def contents(response_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The parsed ``content`` of each ``role=tool`` message."""
    return [json.loads(message["content"]) for message in response_json["messages"]]


def outcome(content: dict[str, Any]) -> str:
    return "OK" if content["ok"] else content["error"]["code"]
