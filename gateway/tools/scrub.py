"""Taking a call's sensitive values out of what a service or MCP server says back.

Services quote the input they refuse (a 422 naming the bad value, a JSON-RPC error repeating
it), and what they say reaches the logs, and through a declared error field the model and
the audit, where sensitive arguments must never be. A JSON body is decoded and its strings
and numbers compared with the values as decoded, so that however the server escaped them
(``\\u00e4``, ``\\/``) they are found; anything else is scrubbed as text, in the forms a
server may write a value (as is, JSON-escaped, percent-encoded, HTML-escaped).

A whole string or number equal to a sensitive value is replaced by ``[REDACTED]``; a value
of at least ``MIN_INNER_CHARS`` characters is also taken out from inside longer strings, in
every form above and form-encoded (a URL a JSON error quotes), and from object keys (a
validation error keyed by the bad value); a shorter one would blank unrelated text, and
says little on its own.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

import msgspec

from gateway.text import MAX_JSON_DEPTH_CEILING, nests_deeper_than
from gateway.tools.base import REDACTED

MIN_INNER_CHARS = 4
MAX_WALKED_DEPTH = MAX_JSON_DEPTH_CEILING
"""Deepest JSON scrubbed value by value (as deep as a tool's answer may nest); a deeper body
is scrubbed as text, where a value shorter than ``MIN_INNER_CHARS`` stays."""

_ANY_JSON = msgspec.json.Decoder()


class Sensitive:
    """A call's sensitive values, as the texts a server may quote them as."""

    __slots__ = ("_whole", "_inner")

    def __init__(self, arguments: Mapping[str, Any], fields: Iterable[str]) -> None:
        whole: set[str] = set()
        for name in fields:
            if name in arguments:
                _collect(arguments[name], whole)
        whole.discard("")
        self._whole = frozenset(whole)
        inner = {form for text in whole if len(text) >= MIN_INNER_CHARS for form in _text_forms(text)}
        # Longest first: a value's form that holds another's is taken out whole.
        self._inner = sorted(inner, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._whole)

    def text(self, value: str) -> str:
        if value in self._whole:
            return REDACTED
        for text in self._inner:
            if text in value:
                value = value.replace(text, REDACTED)
        return value

    def body(self, data: bytes) -> bytes:
        """``data`` with the values taken out: JSON stays JSON (re-encoded), other text stays text."""
        if not self._whole or not data:
            return data
        if not nests_deeper_than(data, MAX_WALKED_DEPTH):
            try:
                document = _ANY_JSON.decode(data)
            except msgspec.DecodeError:
                pass
            else:
                return msgspec.json.encode(self._document(document))
        return self.text(data.decode("utf-8", errors="replace")).encode()

    def _document(self, document: Any) -> Any:
        """The decoded ``document``, scrubbed in place without recursion (a tool's answer may
        nest 512 levels, two Python frames a level for a recursive walk)."""
        if not isinstance(document, (dict, list)):
            return self._leaf(document)
        pending: list[dict[str, Any] | list[Any]] = [document]
        while pending:
            node = pending.pop()
            if isinstance(node, list):
                for index, item in enumerate(node):
                    if isinstance(item, (dict, list)):
                        pending.append(item)
                    else:
                        node[index] = self._leaf(item)
                continue
            items = list(node.items())
            node.clear()
            for key, item in items:
                if isinstance(item, (dict, list)):
                    pending.append(item)
                else:
                    item = self._leaf(item)
                node[self.text(key)] = item
        return document

    def _leaf(self, node: Any) -> Any:
        if isinstance(node, str):
            return self.text(node)
        if isinstance(node, bool) or node is None:
            return node
        if isinstance(node, (int, float)):
            return REDACTED if _number_text(node) in self._whole else node
        return node


def _collect(value: Any, into: set[str]) -> None:
    if isinstance(value, str):
        into.add(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, (int, float)):
        into.add(_number_text(value))
    elif isinstance(value, Mapping):
        for item in value.values():
            _collect(item, into)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, into)


def _number_text(value: int | float) -> str:
    try:
        return msgspec.json.encode(value).decode()
    except (OverflowError, ValueError):
        return repr(value)


def _text_forms(value: str) -> set[str]:
    escaped = json.dumps(value)[1:-1]  # ensure_ascii, as most servers' JSON writers do
    return {value, escaped, escaped.replace("/", "\\/"), json.dumps(value, ensure_ascii=False)[1:-1],
            quote(value, safe="", errors="surrogatepass"), quote_plus(value, safe="", errors="surrogatepass"),
            quote(value, errors="surrogatepass"), html.escape(value)}
