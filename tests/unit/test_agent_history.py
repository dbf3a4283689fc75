"""History trimming keeps the system prompt and the current exchange and never orphans a tool message."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agent.history import (
    NO_OUTPUT,
    PromptBudget,
    close_open_calls,
    cut_for,
    dropped_count,
    prompt_from,
    tool_content,
    trim,
    validate_conversation,
)
from gateway.errors import ErrorCode


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    counter = iter(range(10_000))
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "be brief"})
    for _ in range(draw(st.integers(1, 6))):
        messages.append({"role": "user", "content": "q" * draw(st.integers(1, 400))})
        for _ in range(draw(st.integers(0, 3))):
            ids = [f"c{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [{"id": i, "type": "function",
                                             "function": {"name": "f", "arguments": "{}"}} for i in ids]})
            messages += [{"role": "tool", "tool_call_id": i, "content": "r" * draw(st.integers(1, 300))} for i in ids]
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": "a" * draw(st.integers(1, 300))})
    return messages


@settings(max_examples=200, deadline=None)
@given(conversations(), st.integers(10, 2000))
def test_trimming_drops_whole_exchanges_only(history: list[dict[str, Any]], max_tokens: int) -> None:
    budget = PromptBudget(max_tokens=max_tokens)
    trimmed = trim(history, cut=0, budget=budget, tools_chars=0)
    prompt, cut = trimmed.prompt, trimmed.cut

    assert validate_conversation(prompt) is None  # no tool message without its assistant message
    systems = [m for m in history if m["role"] == "system"]
    assert prompt[: len(systems)] == systems
    last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
    assert prompt[-(len(history) - last_user):] == history[last_user:]  # the current exchange is whole
    assert cut == 0 or history[cut]["role"] == "user"
    assert len(prompt) == len(history) - dropped_count(history, cut)
    if budget.estimate(prompt, 0) > max_tokens:
        assert cut == last_user  # only when nothing more may go


def test_a_cut_only_moves_forward_and_a_fitting_history_is_untouched() -> None:
    history = [{"role": "user", "content": "a" * 400}, {"role": "assistant", "content": "b"},
               {"role": "user", "content": "c"}]
    trimmed = trim(history, cut=0, budget=PromptBudget(max_tokens=10_000), tools_chars=0)
    assert trimmed.prompt == history and trimmed.cut == 0
    trimmed = trim(history, cut=0, budget=PromptBudget(max_tokens=20), tools_chars=0)
    assert trimmed.cut == 2 and trimmed.prompt == [history[2]]
    trimmed = trim(history, cut=2, budget=PromptBudget(max_tokens=10_000), tools_chars=0)
    assert trimmed.cut == 2


def _quadratic_trim(history: list[dict[str, Any]], cut: int, budget: PromptBudget) -> int:
    """The former algorithm, re-encoding the prompt for every candidate cut: the reference."""
    if budget.estimate(prompt_from(history, cut), 0) <= budget.max_tokens:
        return cut
    for start in [i for i in range(cut + 1, len(history)) if history[i]["role"] == "user"]:
        cut = start
        if budget.estimate(prompt_from(history, cut), 0) <= budget.max_tokens:
            break
    return cut


@settings(max_examples=200, deadline=None)
@given(conversations(), st.integers(10, 2000), st.integers(0, 3))
def test_running_sums_cut_where_encoding_every_candidate_prompt_cut(
    history: list[dict[str, Any]], max_tokens: int, start_user: int
) -> None:
    users = [i for i, m in enumerate(history) if m["role"] == "user"]
    cut = users[min(start_user, len(users) - 1)] if start_user else 0
    budget = PromptBudget(max_tokens=max_tokens)
    trimmed = trim(history, cut=cut, budget=budget, tools_chars=0)
    assert trimmed.cut == _quadratic_trim(history, cut, budget)
    assert trimmed.prompt_chars == len(msgspec.json.encode(trimmed.prompt))


def test_trimming_encodes_each_message_once_however_many_exchanges_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16,000 one-word user messages once took seconds of CPU (the prompt re-encoded per candidate cut)."""
    history = [{"role": "system", "content": "be brief"}]
    history += [{"role": "user", "content": "word"} for _ in range(16_000)]
    encoded: list[Any] = []
    real_encode = msgspec.json.encode

    def counting(value: Any, *args: Any, **kwargs: Any) -> bytes:
        encoded.append(value)
        return real_encode(value, *args, **kwargs)

    monkeypatch.setattr(msgspec.json, "encode", counting)
    trimmed = trim(history, cut=0, budget=PromptBudget(max_tokens=10), tools_chars=0)
    monkeypatch.undo()

    assert trimmed.cut == len(history) - 1  # everything but the system prompt and the last message went
    assert len(encoded) == len(history)
    assert all(isinstance(value, dict) for value in encoded)  # one message each, never a whole prompt


def test_the_cut_of_a_resumed_run_is_found_from_its_dropped_count() -> None:
    history = [{"role": "system", "content": "s"}]
    for i in range(5):
        history += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    for cut in [0] + [i for i, m in enumerate(history) if m["role"] == "user"]:
        assert prompt_from(history, cut_for(history, dropped_count(history, cut))) == prompt_from(history, cut)


def test_the_chars_per_token_estimate_learns_from_reported_usage() -> None:
    budget = PromptBudget(max_tokens=100)
    budget.calibrate(prompt_chars=1000, prompt_tokens=500)
    assert budget.chars_per_token == 2.0
    budget.calibrate(prompt_chars=1000, prompt_tokens=0)  # no usage reported: keep what was learnt
    assert budget.chars_per_token == 2.0


def test_empty_tool_results_become_an_explicit_placeholder() -> None:
    assert tool_content("") == NO_OUTPUT
    assert tool_content("  ") == NO_OUTPUT
    assert tool_content('{"ok":true,"result":null}') == '{"ok":true,"result":"(the tool returned no output)"}'
    assert tool_content('{"ok":true,"result":""}') == '{"ok":true,"result":"(the tool returned no output)"}'
    assert tool_content('{"ok":true,"result":[]}') == '{"ok":true,"result":[]}'


def test_open_calls_are_closed_with_the_stop_code_so_the_history_stays_well_formed() -> None:
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                   {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "a", "content": "done"}]
    closing = close_open_calls(history, ErrorCode.RUN_TIMEOUT, "Not finished.")
    assert [m["tool_call_id"] for m in closing] == ["b"]
    assert '"RUN_TIMEOUT"' in closing[0]["content"]
    assert validate_conversation(history) is None
