"""OpenAI-compatible ``POST {base_url}/chat/completions``: OpenAI, vLLM, Ollama's ``/v1``.

``base_url`` includes the version path (``https://api.openai.com/v1``,
``http://host:11434/v1``), as the official clients expect.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from gateway.errors import ErrorCode
from gateway.llm.base import (
    AssistantMessage,
    ChatResult,
    HttpChatModel,
    Message,
    SamplingOptions,
    TokenCount,
    UpstreamError,
    Usage,
    decode_answer,
    model_tool_call,
)

log = structlog.get_logger("gateway.llm")


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None


class _ToolCall(msgspec.Struct):
    function: _Function | None = None
    id: str | None = None
    type: str | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    role: str | None = None


class _Choice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: TokenCount = 0
    completion_tokens: TokenCount = 0


class _Completion(msgspec.Struct):
    choices: list[_Choice]
    usage: _Usage | None = None
    model: str | None = None


_decoder = msgspec.json.Decoder(_Completion)


class OpenAIChatModel(HttpChatModel):
    path = "/chat/completions"

    def payload(self, messages: list[Message], tools: list[dict[str, Any]], options: SamplingOptions) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self.model, "messages": [_wire(m) for m in messages], "stream": False}
        if tools:  # an empty list is refused by some servers: leave it out
            payload["tools"] = tools
        payload.update(options.as_dict())
        if not tools:
            payload.pop("tool_choice", None)
        return payload

    def parse(self, body: bytes) -> ChatResult:
        return parse_completion(body, provider=self.name, fallback_model=self.model)


def _wire(message: Message) -> Message:
    """Our history is already in this format; an assistant message always carries a string content."""
    if message.get("role") == "assistant" and message.get("content") is None:
        return {**message, "content": ""}
    return message


def parse_completion(body: bytes, *, provider: str, fallback_model: str) -> ChatResult:
    completion = decode_answer(_decoder, body, provider=provider)
    if not completion.choices:
        log.warning("model_response_malformed", provider=provider, problem="no choices")
        raise UpstreamError(ErrorCode.UPSTREAM_BAD_RESPONSE)
    choice = completion.choices[0]
    calls = [
        model_tool_call(id=call.id, type=call.type, name=call.function.name if call.function else None,
                        arguments=call.function.arguments if call.function else None)
        for call in choice.message.tool_calls or ()
    ]
    usage = completion.usage
    if usage is None:
        log.warning("model_usage_missing", provider=provider)
        usage = _Usage()
    return ChatResult(
        message=AssistantMessage(content=choice.message.content, tool_calls=calls),
        usage=Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens),
        finish_reason=choice.finish_reason,
        model=completion.model or fallback_model,
    )
