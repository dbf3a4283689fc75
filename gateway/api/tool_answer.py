"""The body of a tool-calls answer, made in one place for the route and its fast lane."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gateway.api.schemas import ToolCallsResponse, ToolMessageOut
from gateway.execution.executor import ToolMessage

_encode = msgspec.json.Encoder().encode


def encode_tool_messages(messages: Iterable[ToolMessage]) -> bytes:
    """``ToolCallsResponse`` as JSON: one ``role=tool`` message per call, in the order given."""
    return _encode(
        ToolCallsResponse(
            messages=[ToolMessageOut(role="tool", tool_call_id=m.tool_call_id, content=m.content) for m in messages]
        )
    )
