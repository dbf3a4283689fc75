"""What PostgreSQL ``text`` and ``jsonb`` can hold: no NUL (``U+0000``), and no lone
surrogate (``U+D800``–``U+DFFF``), which UTF-8 cannot encode at all.

Input from a caller is refused when it holds one; text the gateway must keep whatever it
holds (a model's answer in a run's history) is stored with each such character replaced
by ``U+FFFD``.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> bool:
    """Whether ``text`` holds a character PostgreSQL text or jsonb refuses."""
    return _UNSTORABLE.search(text) is not None


def storable_text(text: str) -> str:
    return _UNSTORABLE.sub(REPLACEMENT, text) if unstorable(text) else text


def holds_unstorable(value: Any) -> bool:
    """Whether a JSON-like value (dicts, lists, strings, keys included) holds unstorable text.
    Iterative: a deeply nested value cannot exhaust the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if unstorable(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def storable(value: Any) -> Any:
    """``value`` with every unstorable character of its strings (and keys) replaced; the value
    itself when it holds none."""
    if not holds_unstorable(value):
        return value
    return _replace(value)


def _replace(value: Any) -> Any:
    # History messages have a fixed, shallow shape (arguments travel as a JSON string).
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k) if isinstance(k, str) else k: _replace(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace(v) for v in value]
    return value
