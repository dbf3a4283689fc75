"""The conversation the model sees: trimmed to fit its context window, never malformed.

- Before each round, if the prompt would pass ``GATEWAY_LLM_HISTORY_SHARE`` of the model's
  context window, the oldest whole exchanges are dropped: an exchange is a user message
  with the assistant and tool messages that follow it, so a tool message never loses the
  assistant message that asked for it. System (and developer) messages and the current
  exchange (from the last user message on) are always kept.
- Prompt size is estimated from its JSON length, calibrated after each round by the
  tokens the provider reported for the prompt it was sent.
- An empty tool result is sent as an explicit placeholder, never as empty content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.errors import ErrorCode
from gateway.execution.results import error_content, ok_content
from gateway.llm.base import Message

KEPT_ROLES = frozenset({"system", "developer"})
DEFAULT_CHARS_PER_TOKEN = 3.5
NO_OUTPUT = "(the tool returned no output)"
_EMPTY_RESULTS = frozenset({ok_content(b"null"), ok_content(b'""')})
_NO_OUTPUT_RESULT = ok_content(msgspec.json.encode(NO_OUTPUT))


def tool_content(content: str | None) -> str:
    """A tool message's content as the model gets it: never empty."""
    if content is None or not content.strip():
        return NO_OUTPUT
    if content in _EMPTY_RESULTS:
        return _NO_OUTPUT_RESULT
    return content


def prompt_from(history: list[Message], cut: int) -> list[Message]:
    """The kept system messages before ``cut``, then everything from ``cut`` on."""
    return [m for m in history[:cut] if m.get("role") in KEPT_ROLES] + history[cut:]


def dropped_count(history: list[Message], cut: int) -> int:
    return sum(1 for m in history[:cut] if m.get("role") not in KEPT_ROLES)


def cut_for(history: list[Message], dropped: int) -> int:
    """Where the history was cut when ``dropped`` messages had been dropped (one pass)."""
    if dropped <= 0:
        return 0
    count = 0
    for index, message in enumerate(history):
        if message.get("role") == "user" and count >= dropped:
            return index
        if message.get("role") not in KEPT_ROLES:
            count += 1
    return 0


def encoded_sizes(messages: list[Message]) -> list[int]:
    """Each message's JSON length, each message encoded once."""
    encode = msgspec.json.encode
    return [len(encode(m)) for m in messages]


def list_chars(sizes_total: int, count: int) -> int:
    """The JSON length of a list of ``count`` items whose own lengths sum to ``sizes_total``."""
    return 2 + sizes_total + max(count - 1, 0)


@dataclass(slots=True)
class PromptBudget:
    """How many tokens a prompt may take, and how prompt length converts to tokens."""

    max_tokens: int
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN

    def tokens(self, prompt_chars: int, tools_chars: int) -> int:
        return int((prompt_chars + tools_chars) / self.chars_per_token) + 1

    def estimate(self, messages: list[Message], tools_chars: int) -> int:
        return self.tokens(len(msgspec.json.encode(messages)), tools_chars)

    def calibrate(self, prompt_chars: int, prompt_tokens: int) -> None:
        """Learn the provider's chars per token from a prompt it counted."""
        if prompt_tokens > 0 and prompt_chars > 0:
            self.chars_per_token = min(8.0, max(1.0, prompt_chars / prompt_tokens))


@dataclass(frozen=True, slots=True)
class Trimmed:
    prompt: list[Message]
    cut: int
    prompt_chars: int
    """The prompt's JSON length (without the tools)."""


def trim(history: list[Message], *, cut: int, budget: PromptBudget, tools_chars: int) -> Trimmed:
    """Drop the oldest whole exchanges until the prompt fits; returns the prompt, the new cut and its size.

    ``cut`` only ever moves forward, to the start of a user message: what was dropped for
    one round stays dropped for the next. Linear in the history: each message is encoded
    once, and the size of the prompt for each candidate cut comes from running sums.
    """
    sizes = encoded_sizes(history)
    # The prompt for a cut c: kept messages before c, then history[c:].
    kept_before = kept_chars = 0
    for index in range(cut):
        if history[index].get("role") in KEPT_ROLES:
            kept_before += 1
            kept_chars += sizes[index]
    tail_chars = sum(sizes[cut:])

    prompt_chars = list_chars(kept_chars + tail_chars, kept_before + len(history) - cut)
    if budget.tokens(prompt_chars, tools_chars) > budget.max_tokens:
        # The last user message opens the current exchange: it is never dropped.
        index = cut
        while index < len(history) - 1:
            if history[index].get("role") in KEPT_ROLES:
                kept_before += 1
                kept_chars += sizes[index]
            tail_chars -= sizes[index]
            index += 1
            if history[index].get("role") != "user":
                continue
            cut = index
            prompt_chars = list_chars(kept_chars + tail_chars, kept_before + len(history) - cut)
            if budget.tokens(prompt_chars, tools_chars) <= budget.max_tokens:
                break
    return Trimmed(prompt=prompt_from(history, cut), cut=cut, prompt_chars=prompt_chars)


def open_tool_calls(history: list[Message]) -> list[dict[str, Any]]:
    """The tool calls of the last assistant message that no tool message answers yet."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.get("role") == "assistant":
            answered = {m.get("tool_call_id") for m in history[index + 1:] if m.get("role") == "tool"}
            return [c for c in message.get("tool_calls") or () if c.get("id") not in answered]
        if message.get("role") != "tool":
            return []
    return []


def close_open_calls(history: list[Message], code: ErrorCode, message: str) -> list[Message]:
    """Answer every open tool call with ``code`` (not run), so the history stays well formed."""
    closing = [
        {"role": "tool", "tool_call_id": call["id"], "content": error_content(code, message)}
        for call in open_tool_calls(history)
    ]
    history.extend(closing)
    return closing


def validate_conversation(messages: list[Message]) -> str | None:
    """What is wrong with a client's conversation, or None: a model provider would refuse it."""
    expected: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in expected:
                return (f"messages[{index}]: a tool message must answer a tool call of the assistant "
                        "message before it (tool_call_id)")
            expected.discard(message.get("tool_call_id"))
            continue
        if expected and role != "tool":
            return f"messages[{index}]: the tool calls of the assistant message before it are not all answered"
        expected = {c["id"] for c in message.get("tool_calls") or ()} if role == "assistant" else set()
    if expected:
        return "the tool calls of the last assistant message are not answered by tool messages"
    return None
