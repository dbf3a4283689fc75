"""The interface the agent loop talks to: ``chat(messages, tools) -> (message, usage)``.

Messages travel in the OpenAI chat format (plain dicts: ``role``, ``content``,
``tool_calls``, ``tool_call_id``); each adapter converts to and from its provider's wire
format, so the loop never learns which provider answers it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.errors import ErrorCode, GatewayError

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


@dataclass(frozen=True, slots=True)
class ModelToolCall:
    id: str | None
    name: str
    arguments: str
    """A JSON string, exactly as the model produced it (Ollama's objects are encoded)."""


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    content: str | None
    tool_calls: list[ModelToolCall] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChatResult:
    message: AssistantMessage
    usage: Usage
    finish_reason: str | None
    model: str


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """What a request may tune in each model call; ``None`` leaves the provider's default."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tool_choice: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingOptions:
        known = set(cls.__slots__)  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


class ChatModel(Protocol):
    name: str
    """The provider's configured name (``default`` for the ``GATEWAY_LLM_*`` one)."""
    model: str
    context_window: int

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        options: SamplingOptions,
        deadline: float | None = None,
    ) -> ChatResult:
        """One model round trip; ``deadline`` (event-loop time) is the run's, for retry decisions."""
        ...


class UpstreamError(GatewayError):
    """The model provider failed in a way the caller must hear about (502/504)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(code, message)


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
