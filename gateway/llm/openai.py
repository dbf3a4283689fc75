"""OpenAI-compatible ``POST {base_url}/chat/completions``: OpenAI, vLLM, Ollama's ``/v1``.

``base_url`` includes the version path (``https://api.openai.com/v1``,
``http://host:11434/v1``), as the official clients expect.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from gateway.errors import ErrorCode
from gateway.llm.base import AssistantMessage, ChatResult, Message, ModelToolCall, SamplingOptions, UpstreamError, Usage
from gateway.llm.transport import UpstreamTransport
from gateway.settings import LlmProvider

log = structlog.get_logger("gateway.llm")


class _Function(msgspec.Struct):
    name: str
    arguments: str | dict[str, Any] | None = None


class _ToolCall(msgspec.Struct):
    function: _Function
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
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Completion(msgspec.Struct):
    choices: list[_Choice]
    usage: _Usage | None = None
    model: str | None = None


_decoder = msgspec.json.Decoder(_Completion)


class OpenAIChatModel:
    def __init__(self, provider: LlmProvider, transport: UpstreamTransport) -> None:
        self.name = provider.name
        self.model = provider.model
        self.context_window = provider.context_window
        self._provider = provider
        self._transport = transport
        self._url = provider.base_url.rstrip("/") + "/chat/completions"

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        options: SamplingOptions,
        deadline: float | None = None,
    ) -> ChatResult:
        payload: dict[str, Any] = {"model": self.model, "messages": [_wire(m) for m in messages], "stream": False}
        if tools:  # an empty list is refused by some servers: leave it out
            payload["tools"] = tools
        payload.update(options.as_dict())
        if not tools:
            payload.pop("tool_choice", None)
        body = await self._transport.post_json(
            self._url,
            payload,
            provider=self.name,
            api_key=self._provider.api_key,
            timeout_s=self._provider.timeout_s,
            deadline=deadline,
        )
        return parse_completion(body, provider=self.name, fallback_model=self.model)


def _wire(message: Message) -> Message:
    """Our history is already in this format; an assistant message always carries a string content."""
    if message.get("role") == "assistant" and message.get("content") is None:
        return {**message, "content": ""}
    return message


def parse_completion(body: bytes, *, provider: str, fallback_model: str) -> ChatResult:
    try:
        completion = _decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        log.warning("model_response_malformed", provider=provider, problem=_problem(exc))
        raise UpstreamError(ErrorCode.UPSTREAM_BAD_RESPONSE) from None
    if not completion.choices:
        log.warning("model_response_malformed", provider=provider, problem="no choices")
        raise UpstreamError(ErrorCode.UPSTREAM_BAD_RESPONSE)
    choice = completion.choices[0]
    calls = []
    for call in choice.message.tool_calls or ():
        if not call.function.name:
            log.warning("model_response_malformed", provider=provider, problem="tool call without a name")
            raise UpstreamError(ErrorCode.UPSTREAM_BAD_RESPONSE)
        arguments = call.function.arguments
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = msgspec.json.encode(arguments).decode()
        calls.append(ModelToolCall(id=call.id, name=call.function.name, arguments=arguments))
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


def _problem(exc: Exception) -> str:
    """msgspec's message names the path and the expected type; it quotes no content."""
    return str(exc).splitlines()[0][:200] if isinstance(exc, msgspec.ValidationError) else "not JSON"
