"""Request and response bodies of the HTTP API (msgspec Structs; input forbids unknown fields)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from gateway.execution.protocol import MAX_TOOL_CALL_ID_LENGTH, MAX_TOOL_NAME_LENGTH

PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
DateTime = Annotated[datetime, msgspec.Meta(extra_json_schema={"format": "date-time"})]
"""An RFC 3339 date-time (msgspec decodes it so but does not say so in its schema)."""


class Input(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class RunLimitsIn(Input):
    max_tool_calls: PositiveInt | None = None
    max_repeats: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    expires_at: DateTime | None = None


class RunCreate(RunLimitsIn):
    """The limits may be given at the top level or under ``limits``, not both."""

    limits: RunLimitsIn | None = None


WHITE_SPACE = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""What Python's ``str.strip()`` removes, spelled out: ``\\s`` means less than that in JSON Schema
(ECMA-262) regular expressions, so a pattern with ``\\s`` would say less than the server checks."""
NOT_BLANK_NOR_NUL = rf"^[^\x00]*[^\x00{WHITE_SPACE}][^\x00]*$"
"""Some character other than white space, and no NUL (PostgreSQL text cannot hold it)."""


class FunctionCallContract(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TOOL_NAME_LENGTH, pattern=NOT_BLANK_NOR_NUL)]
    arguments: str | dict[str, Any]
    """The arguments as the model produced them: a JSON text (as OpenAI sends it) or an object."""


class ToolCallContract(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One entry of an assistant message's ``tool_calls``; a field besides these is refused."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TOOL_CALL_ID_LENGTH, pattern=NOT_BLANK_NOR_NUL)]
    type: Literal["function"]
    function: FunctionCallContract


class ToolCallBatchContract(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What ``POST /v1/runs/{run_id}/tool-calls`` accepts. The route decodes leniently
    (``gateway.execution.protocol``) so that it can answer a batch that breaks this contract
    with ``422 INVALID_TOOL_CALL``; this Struct only documents the contract."""

    tool_calls: Annotated[list[ToolCallContract], msgspec.Meta(min_length=1)]


class RunLimits(msgspec.Struct):
    max_tool_calls: int
    max_repeats: int
    expires_at: datetime | None
    # An agent run's loop limits (null for a run a client drives through /tool-calls).
    max_steps: int | None = None
    max_total_tokens: int | None = None
    timeout_s: float | None = None


class RunUsage(msgspec.Struct):
    tool_calls: int
    # An agent run's model calls and tokens, summed over its rounds.
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class HistoryToolCall(msgspec.Struct):
    id: str
    type: str
    function: dict[str, Any]


class HistoryMessage(msgspec.Struct, omit_defaults=True):
    """One message of an agent run's history, in the OpenAI chat format."""

    role: str
    content: str | None = None
    name: str | None = None
    tool_calls: list[HistoryToolCall] | None = None
    tool_call_id: str | None = None


class RunView(msgspec.Struct):
    id: str
    tenant_id: str
    user_id: str
    status: str
    limits: RunLimits
    usage: RunUsage
    created_at: datetime
    state: str | None = None
    """The agent loop's state: ``running``, ``completed``, ``stopped``, ``awaiting_approval``, ``failed`` or
    ``cancelled``; null for a run a client drives through /tool-calls."""
    stop_reason: str | None = None
    provider: str | None = None
    model: str | None = None
    messages_dropped: int = 0
    messages: list[HistoryMessage] = msgspec.field(default_factory=list)


class ToolMessageOut(msgspec.Struct):
    role: str
    tool_call_id: str
    content: str
    """A JSON string: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}``."""


class ToolCallsResponse(msgspec.Struct):
    messages: list[ToolMessageOut]


class FunctionDefinition(msgspec.Struct):
    name: str
    description: str
    parameters: dict[str, Any]


class ToolDefinition(msgspec.Struct):
    type: str
    function: FunctionDefinition


class ToolList(msgspec.Struct):
    tools: list[ToolDefinition]


class ErrorInfo(msgspec.Struct, omit_defaults=True):
    code: str
    message: str
    retryable: bool
    approval_id: str | None = None
    error_id: str | None = None


class ApprovalOutcome(msgspec.Struct, omit_defaults=True):
    code: str
    """``OK`` or the error code of the executed (or refused) call."""
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    truncated: bool = False
    original_bytes: int | None = None


class ApprovalView(msgspec.Struct):
    id: str
    status: str
    """``pending``, ``executing``, ``succeeded``, ``failed``, ``rejected`` or ``expired``."""
    tool: str
    arguments: dict[str, Any]
    """The frozen arguments exactly as they will execute, sensitive fields redacted unless revealed."""
    arguments_sha256: str | None
    """sha256 of the frozen canonical arguments; ``null`` while ``redacted_fields`` hides some of
    them (beside a hidden value, its hash would let anyone test guesses of that value)."""
    run_id: str
    tool_call_id: str
    requested_by: str
    requested_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    outcome: ApprovalOutcome | None
    redacted_fields: list[str]
    """The sensitive fields whose values ``arguments`` shows as ``[REDACTED]`` (every field while
    the tool is unknown to this process: nothing then says which are sensitive); an approver
    sees them with ``GET /v1/admin/approvals/{id}?reveal=true`` (audited)."""


class ApprovalPage(msgspec.Struct):
    items: list[ApprovalView]
    next_cursor: str | None = None


class RejectBody(Input):
    # No NUL: PostgreSQL text and jsonb cannot store it.
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=1000, pattern=r"^[^\x00]*$")]


class ErrorBody(msgspec.Struct, omit_defaults=True):
    code: str
    message: str
    request_id: str | None = None
    error_id: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


class Health(msgspec.Struct):
    status: str


class Jwk(msgspec.Struct, omit_defaults=True):
    """A public key (RFC 7517): EC keys carry crv/x/y, RSA keys n/e."""

    kty: str
    kid: str
    use: str
    alg: str
    crv: str | None = None
    x: str | None = None
    y: str | None = None
    n: str | None = None
    e: str | None = None


class Jwks(msgspec.Struct):
    keys: list[Jwk]
