"""The scripted demo model: keyword rules in place of a language model, for demo mode only.

``gateway serve --demo`` without a configured model provider offers it, so that the agent
loop can be tried without a model server. It is no language model and says so: its name is
``demo-scripted`` and every answer starts with ``[demo model]``. It answers in-process (no
network) and follows simple rules on the conversation's last user message:

- ``add 2 and 3`` (or ``2 plus 3``) calls ``add``; ``multiply 6 by 7`` (or ``6 times 7``)
  ``multiply``; ``divide 10 by 2`` (or ``10 divided by 2``) ``divide``; ``time``
  ``get_current_time``; ``create an article`` (``write an article``, optionally
  ``titled "..."``) ``create_article``;
- it calls them one per round, in the order the message names them, and only the tools it
  was offered;
- once every call was answered it sums the results up in words; a call that waits for an
  approval makes it say so and stop asking.

It is refused outside demo mode (``check_demo_model``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.llm.base import (
    AssistantMessage,
    ChatResult,
    Message,
    SamplingOptions,
    Usage,
    model_tool_call,
    new_tool_call_id,
)
from gateway.settings import Settings, SettingsError
from gateway.text import nests_deeper_than

if TYPE_CHECKING:  # prometheus-client is imported by the processes that serve, not by `serve` before its workers
    from gateway.observability.metrics import Metrics

DEMO_MODEL = "demo-scripted"
"""The demo model's provider name and model name, in ``GET /v1/models`` and every run."""
PREFIX = "[demo model]"
MAX_SCANNED_CHARS = 10_000
"""Only the start of a message is read for keywords: the rules are demo-sized."""
RESULT_PREVIEW = 200
MAX_PLANNED_CALLS = 8
"""At most this many calls for one message (a run's steps stop it sooner anyway)."""
MAX_JSON_DEPTH = 64

_NUMBER = r"(-?\d{1,16})(?!\d)"
_WORDS = re.I | re.A
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("add", re.compile(rf"\badd\s+{_NUMBER}\s+(?:and|to|\+)\s+{_NUMBER}|{_NUMBER}\s+(?:plus|\+)\s+{_NUMBER}", _WORDS)),
    ("multiply", re.compile(
        rf"\bmultiply\s+{_NUMBER}\s+(?:and|by|with)\s+{_NUMBER}|{_NUMBER}\s+(?:times|\*)\s+{_NUMBER}", _WORDS)),
    ("divide", re.compile(
        rf"\bdivide\s+{_NUMBER}\s+by\s+{_NUMBER}|{_NUMBER}\s+(?:divided\s+by|/)\s+{_NUMBER}", _WORDS)),
    ("get_current_time", re.compile(r"\b(?:time|clock)\b", _WORDS)),
    ("create_article", re.compile(
        r"\b(?:create|write|add|publish)\s+(?:an?\s+|one\s+)?(?:new\s+)?article\b", _WORDS)),
)
_TITLE = re.compile(r"\b(?:titled|called|named)\s+[\"“']([^\"”'\x00]{1,200})[\"”']", _WORDS)
DEFAULT_TITLE = "A note from the demo model"
DEFAULT_BODY = "Written by the gateway's scripted demo model, at a user's request, once an approver agreed."

HELP = (
    f"{PREFIX} I am the gateway's scripted demo model, not a language model: I follow keyword rules. "
    'Try "add 2 and 3", "multiply 6 by 7", "divide 10 by 2", "what time is it" or "create an article" '
    '(several in one message: "add 2 and 3, then create an article").'
)


@dataclass(frozen=True, slots=True)
class PlannedCall:
    name: str
    arguments: dict[str, Any]


def plan(text: str) -> list[PlannedCall]:
    """The calls a user message asks for, in the order it names them."""
    text = text[:MAX_SCANNED_CHARS]
    found: list[tuple[int, PlannedCall]] = []
    for name, pattern in _RULES:
        for match in pattern.finditer(text):
            if name == "create_article":
                title = _TITLE.search(text)
                named = title.group(1).strip() if title else ""
                arguments = {"title": named or DEFAULT_TITLE, "body": DEFAULT_BODY}
                found.append((match.start(), PlannedCall(name, arguments)))
                break  # one article per message
            if name == "get_current_time":
                found.append((match.start(), PlannedCall(name, {})))
                break  # one look at the clock per message
            numbers = [int(group) for group in match.groups() if group is not None]
            found.append((match.start(), PlannedCall(name, {"a": numbers[0], "b": numbers[1]})))
    return [call for _, call in sorted(found, key=lambda item: item[0])][:MAX_PLANNED_CALLS]


def check_demo_model(settings: Settings) -> None:
    """Stop start-up when the scripted demo model is asked for outside demo mode: it is no
    language model, and a gateway in service must never answer with it."""
    asked = settings.llm.kind == "demo" or any(provider.kind == "demo" for provider in settings.llm.providers)
    if asked and not settings.demo:
        raise SettingsError(
            "the scripted demo model (GATEWAY_LLM_KIND=demo, or a provider of kind `demo`) exists only in demo mode "
            "(`gateway serve --demo`); configure a real model with GATEWAY_LLM_BASE_URL and GATEWAY_LLM_MODEL"
        )


def offers_demo_model(settings: Settings) -> bool:
    """Demo mode with no model provider configured offers the scripted demo model (or when asked for it)."""
    return settings.demo and (settings.llm.kind == "demo" or not settings.llm.model_providers())


class DemoScriptedModel:
    """A ``ChatModel`` that answers by the rules above, in-process."""

    def __init__(self, name: str, metrics: Metrics) -> None:
        self.name = name
        self.model = DEMO_MODEL
        self.context_window = 32_768
        self._metrics = metrics

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        options: SamplingOptions,
        deadline: float | None = None,
    ) -> ChatResult:
        started = time.perf_counter()
        message = answer(messages, tools, options)
        usage = Usage(
            prompt_tokens=sum(len(_text(m.get("content"))) for m in messages) // 4 + 1,
            completion_tokens=len(message.content or "") // 4 + 8 * len(message.tool_calls) + 1,
        )
        self._metrics.model_call(
            model=self.model, duration_s=time.perf_counter() - started,
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
        )
        finish = "tool_calls" if message.tool_calls else "stop"
        return ChatResult(message=message, usage=usage, finish_reason=finish, model=self.model)


def answer(messages: list[Message], tools: list[dict[str, Any]], options: SamplingOptions) -> AssistantMessage:
    """The next assistant message for this conversation."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last_user is None:
        return AssistantMessage(content=HELP)
    wanted = plan(_text(messages[last_user].get("content")))
    since = messages[last_user + 1:]
    asked = [call for m in since if m.get("role") == "assistant" for call in (m.get("tool_calls") or ())]
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in since if m.get("role") == "tool"}
    answered = [(_call_name(call), results.get(call.get("id"), "")) for call in asked]
    for name, content in answered:
        if _error_code(content) == "APPROVAL_REQUIRED":
            return AssistantMessage(content=_summary(answered, waiting=name))
    offered = {_tool_name(tool) for tool in tools}
    if options.tool_choice != "none":
        remaining = wanted[len(asked):]
        for call in remaining:
            if call.name in offered:
                return AssistantMessage(content=None, tool_calls=[model_tool_call(
                    id=new_tool_call_id(), name=call.name, arguments=call.arguments, type="function")])
            answered.append((call.name, "not offered"))
    if not answered:
        return AssistantMessage(content=HELP)
    return AssistantMessage(content=_summary(answered, waiting=None))


def _summary(answered: list[tuple[str, str]], *, waiting: str | None) -> str:
    parts = [_describe(name, content) for name, content in answered if _error_code(content) != "APPROVAL_REQUIRED"]
    if waiting is not None:
        parts.append(f"{waiting} is waiting for an approver's decision; resume the run once it is decided")
    return f"{PREFIX} " + "; ".join(parts) + "."


def _describe(name: str, content: str) -> str:
    if content == "not offered":
        return f"I may not use {name}, so I did not call it"
    decoded = _decode(content)
    if isinstance(decoded, dict) and decoded.get("ok") is True:
        value = decoded.get("result")
        if isinstance(value, dict) and isinstance(value.get("id"), str):  # a record: named by its id and title
            title = value.get("title")
            named = f" {msgspec.json.encode(title[:RESULT_PREVIEW]).decode()}" if isinstance(title, str) else ""
            return f"{name} returned {value['id'][:RESULT_PREVIEW]}{named}"
        result = msgspec.json.encode(value).decode()
        if len(result) > RESULT_PREVIEW:
            result = result[:RESULT_PREVIEW] + "..."
        return f"{name} returned {result}"
    code = _error_code(content) or "an unreadable result"
    return f"{name} did not succeed ({code})"


def _error_code(content: str) -> str | None:
    decoded = _decode(content)
    if isinstance(decoded, dict) and decoded.get("ok") is False and isinstance(decoded.get("error"), dict):
        code = decoded["error"].get("code")
        return code if isinstance(code, str) else None
    return None


def _decode(content: str) -> Any:
    if nests_deeper_than(content.encode(errors="replace"), MAX_JSON_DEPTH):
        return None
    try:
        return msgspec.json.decode(content)
    except msgspec.DecodeError:
        return None


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content
                        if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _call_name(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else "?"


def _tool_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None
