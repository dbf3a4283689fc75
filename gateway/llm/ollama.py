"""Ollama's native ``POST {base_url}/api/chat`` (``base_url`` without ``/v1``).

The native format differs from OpenAI's: tool-call arguments are JSON objects, tool calls
carry no ids (the adapter makes them), a tool result names its tool (``tool_name``)
instead of a call id, usage is ``prompt_eval_count``/``eval_count`` and sampling options
go under ``options`` (the context window as ``num_ctx``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.llm.base import (
    AssistantMessage,
    ChatResult,
    HttpChatModel,
    Message,
    SamplingOptions,
    TokenCount,
    Usage,
    decode_answer,
    model_tool_call,
    new_tool_call_id,
)
from gateway.text import MAX_JSON_DEPTH_CEILING, nests_deeper_than


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: dict[str, Any] | str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function | None = None
    id: str | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Answer(msgspec.Struct):
    message: _Message
    model: str | None = None
    done_reason: str | None = None
    prompt_eval_count: TokenCount = 0
    eval_count: TokenCount = 0


_decoder = msgspec.json.Decoder(_Answer)

_OPTION_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "num_predict",
    "stop": "stop",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


class OllamaChatModel(HttpChatModel):
    path = "/api/chat"

    def payload(self, messages: list[Message], tools: list[dict[str, Any]], options: SamplingOptions) -> dict[str, Any]:
        wire_options: dict[str, Any] = {"num_ctx": self.context_window}
        for name, value in options.as_dict().items():
            if name in _OPTION_NAMES:
                wire_options[_OPTION_NAMES[name]] = value
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": to_native(messages),
            "stream": False,
            "options": wire_options,
        }
        if tools and options.tool_choice != "none":
            payload["tools"] = tools
        return payload

    def parse(self, body: bytes) -> ChatResult:
        return parse_answer(body, provider=self.name, fallback_model=self.model)


def to_native(messages: list[Message]) -> list[Message]:
    names: dict[str, str] = {}
    native: list[Message] = []
    for message in messages:
        role = message.get("role")
        out: Message = {"role": role, "content": message.get("content") or ""}
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function", {})
                names[call.get("id", "")] = function.get("name", "")
                calls.append({"function": {"name": function.get("name", ""),
                                           "arguments": _as_object(function.get("arguments"))}})
            out["tool_calls"] = calls
        elif role == "tool":
            name = names.get(message.get("tool_call_id", ""))
            if name:
                out["tool_name"] = name
        native.append(out)
    return native


def _as_object(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        # A model's text: nested past the ceiling, decoding it would recurse until RecursionError.
        if nests_deeper_than(arguments.encode("utf-8", "surrogatepass"), MAX_JSON_DEPTH_CEILING):
            return {}
        try:
            decoded = msgspec.json.decode(arguments)
        except msgspec.DecodeError:
            return {}
        return decoded if isinstance(decoded, dict) else {}
    return {}


def parse_answer(body: bytes, *, provider: str, fallback_model: str) -> ChatResult:
    answer = decode_answer(_decoder, body, provider=provider)
    calls = [
        model_tool_call(id=call.id or new_tool_call_id(), name=call.function.name if call.function else None,
                        arguments=call.function.arguments if call.function else None)
        for call in answer.message.tool_calls or ()
    ]
    finish_reason = answer.done_reason
    if calls and finish_reason == "stop":
        finish_reason = "tool_calls"  # the native API has no such reason; it is not a disagreement
    return ChatResult(
        message=AssistantMessage(content=answer.message.content, tool_calls=calls),
        usage=Usage(prompt_tokens=answer.prompt_eval_count, completion_tokens=answer.eval_count),
        finish_reason=finish_reason,
        model=answer.model or fallback_model,
    )
