"""Bodies of the OpenAI-compatible chat API (``POST /v1/chat/completions``) and its resume route.

The request accepts what the official clients send; parameters the gateway cannot honour
(``n`` > 1, ``logprobs``) are refused rather than ignored. The response is a standard chat
completion with one extension object, ``gateway``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from gateway.api.schemas import Input, PositiveInt
from gateway.text import refuse_line_breaks


class TextPart(msgspec.Struct, kw_only=True):
    """Only text parts are supported."""

    type: Literal["text"]
    text: str


class FunctionCallIn(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCallIn(msgspec.Struct, kw_only=True):
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(Input):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    # Fields the official clients echo back when an answer is appended to the conversation.
    refusal: str | None = None
    function_call: Any = None
    audio: Any = None
    annotations: Any = None


class FunctionDefinitionIn(Input):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    def __post_init__(self) -> None:
        refuse_line_breaks(name=self.name)


class ClientToolIn(Input):
    type: Literal["function"]
    function: FunctionDefinitionIn


class StreamOptions(Input):
    include_usage: bool = False


class GatewayOptions(Input):
    """The gateway's own request fields (``extra_body={"gateway": {...}}`` with the official client).

    Loop limits may only be lowered below the settings' defaults.
    """

    max_steps: PositiveInt | None = None
    max_total_tokens: PositiveInt | None = None
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] | None = None
    max_tool_calls: PositiveInt | None = None
    max_repeats: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None


TOOL_MESSAGE_NEEDS_ITS_CALL = {
    "if": {"properties": {"role": {"const": "tool"}}, "required": ["role"]},
    "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string", "minLength": 1}}},
}
"""A ``role=tool`` message answers one call: it names it."""


class ChatCompletionRequest(Input):
    model: str
    messages: Annotated[
        list[Annotated[ChatMessageIn, msgspec.Meta(extra_json_schema=TOOL_MESSAGE_NEEDS_ITS_CALL)]],
        msgspec.Meta(min_length=1),
    ]
    tools: list[ClientToolIn] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None
    logprobs: Annotated[bool, msgspec.Meta(extra_json_schema={"const": False})] | None = None
    """Not supported: ``true`` is refused."""
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    gateway: GatewayOptions | None = None


class ResumeRequest(Input):
    stream: bool = False
    stream_options: StreamOptions | None = None


# -- responses ------------------------------------------------------------------------------


class FunctionCallOut(msgspec.Struct):
    name: str
    arguments: str


class ToolCallOut(msgspec.Struct):
    id: str
    type: str
    function: FunctionCallOut


class CompletionMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class Choice(msgspec.Struct):
    index: int
    message: CompletionMessage
    finish_reason: str
    logprobs: None = None


class CompletionUsage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TraceItem(msgspec.Struct, omit_defaults=True):
    round: int
    tool_call_id: str
    name: str
    arguments: Any
    outcome: str
    """``OK`` or the error code the model was answered with."""
    content: str
    """The ``role=tool`` content the model got."""
    approval_id: str | None = None


class PendingApprovalView(msgspec.Struct):
    approval_id: str
    tool_call_id: str
    tool: str
    arguments: Any


class StopReason(msgspec.Struct, omit_defaults=True):
    code: str
    """``MAX_STEPS_EXCEEDED``, ``TOKEN_BUDGET_EXCEEDED``, ``RUN_TIMEOUT`` or ``APPROVAL_REQUIRED``."""
    message: str
    approval_ids: list[str] | None = None
    pending: list[PendingApprovalView] | None = None


class LoopLimitsView(msgspec.Struct):
    max_steps: int
    max_total_tokens: int
    timeout_s: float


class GatewayExtension(msgspec.Struct):
    run_id: str
    provider: str
    state: str
    stop_reason: StopReason | None
    """Null when the model answered; else why the run stopped."""
    steps: int
    messages_dropped: int
    """History messages left out of the prompt to fit the model's context window."""
    limits: LoopLimitsView
    trace: list[TraceItem]


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    gateway: GatewayExtension
    object: str = "chat.completion"
    system_fingerprint: None = None


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
