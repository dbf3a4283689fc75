"""The result cap: a result larger than the call's effective ``max_result_bytes`` is cut,
visibly (``truncated``, the original size when known, a marker), never refused. A handler
that reads its result in pieces (an HTTP body) stops at the cap and returns a
``PartialResult``."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.execution.guards.base import Call, Guard, Stage
from gateway.execution.results import ok_content
from gateway.tools.base import PartialResult, Tool, ToolContext

TRUNCATION_MARKER = "…[truncated]"


class TruncatedResult(msgspec.Struct, omit_defaults=True):
    ok: bool
    result: str
    truncated: bool
    original_bytes: int | None = None
    """Left out when the original size is not known (a body that was not read to its end)."""


_encoder = msgspec.json.Encoder()


def encode_result(result: object, *, max_bytes: int) -> str:
    """Encode a tool's result; one larger than ``max_bytes`` is cut, visibly, with its original size."""
    if isinstance(result, PartialResult):
        return _truncated(result.kept[:max_bytes], result.original_bytes)
    encoded = _encoder.encode(result)
    if len(encoded) <= max_bytes:
        return ok_content(encoded)
    return _truncated(encoded[:max_bytes], len(encoded))


def _truncated(kept: bytes, original_bytes: int | None) -> str:
    text = kept.decode("utf-8", errors="ignore")
    return _encoder.encode(
        TruncatedResult(ok=True, result=text + TRUNCATION_MARKER, truncated=True, original_bytes=original_bytes)
    ).decode()


def around(call: Call) -> Call:
    async def capped(tool: Tool, arguments: Any, ctx: ToolContext) -> str:
        assert ctx.max_result_bytes is not None
        return encode_result(await call(tool, arguments, ctx), max_bytes=ctx.max_result_bytes)

    return capped


GUARD = Guard(name="result_cap", stage=Stage.EXECUTION, code=None, around=around)
