"""Text and JSON documents from outside (callers, models, services): what the gateway accepts.

Three rules, each checked here and nowhere else:

- **Storable text.** PostgreSQL ``text`` and ``jsonb`` cannot hold NUL (``\\u0000``), and UTF-8
  cannot encode a lone surrogate (``\\ud800`` without its pair). Text holding either is refused
  where it comes in, before it can reach a query, a log line or an error message.
- **Bounded nesting.** A JSON document may nest at most ``max_depth`` arrays and objects (the
  setting ``GATEWAY_MAX_JSON_DEPTH``). Decoders recurse; a document nested a thousand deep makes
  them raise ``RecursionError``, so depth is counted first, by a linear scan of the bytes.
- **A key once per object.** JSON leaves a repeated key undefined and parsers disagree on which
  value wins (see ``gateway.tools.repeated_keys``): a document giving a key twice is refused.

``json_document_problem`` applies all three to a document and says what is wrong, in words safe
to show the caller (``quoted`` escapes whatever is quoted). ``decode_error_message`` turns a
decoder's complaint into words naming the line and column where the document broke.
"""

from __future__ import annotations

import math
import re
from array import array
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

import msgspec
from msgspec import inspect

from gateway.tools.repeated_keys import repeated_key

DEFAULT_MAX_JSON_DEPTH = 64
MAX_JSON_DEPTH_CEILING = 512
"""The highest ``GATEWAY_MAX_JSON_DEPTH`` accepted: well below where decoders run out of stack."""

MAX_QUOTED = 64

# --- anchored patterns ---------------------------------------------------------------------


def refuse_line_breaks(**fields: str | list[str] | None) -> None:
    """Raise ``ValueError`` naming the first field whose text (or any of whose texts) holds a
    line break. For fields checked by a pattern ``^[...]$`` whose characters exclude it:
    msgspec and Litestar check patterns with Python's ``re.search``, where ``$`` also matches
    before a final newline, so ``"ops\\n"`` would pass. The published pattern stays the plain
    ``^...$`` (exact in JSON Schema's ECMA-262, and in engines without lookaround, such as
    RE2); this closes the gap on the server's side. msgspec reports the error as the
    document's validation error."""
    for name, value in fields.items():
        if isinstance(value, str):
            if "\n" in value:
                raise ValueError(f"`{name}` must not hold a line break")
            continue
        for index, text in enumerate(value or []):
            if "\n" in text:
                raise ValueError(f"`{name}[{index}]` must not hold a line break")


# --- storable text -------------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def is_storable(text: str) -> bool:
    """Whether PostgreSQL can store ``text`` (no NUL) and UTF-8 can encode it (no lone surrogate)."""
    if "\x00" in text:
        return False
    return text.isascii() or _SURROGATE.search(text) is None


def unstorable_text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored, in words for a message, or ``None``."""
    if "\x00" in text:
        return "it contains a NUL character (\\u0000)"
    if not text.isascii() and _SURROGATE.search(text) is not None:
        return "it contains a lone UTF-16 surrogate, which is not a character"
    return None


REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` with each character PostgreSQL cannot store replaced by U+FFFD: for text the
    gateway must keep whatever it holds (a model's answer in a run's history)."""
    return text if is_storable(text) else _UNSTORABLE.sub(REPLACEMENT, text)


def holds_unstorable(value: Any) -> bool:
    """Whether a JSON-like value (dicts, lists, strings, keys included) holds unstorable text.
    Iterative: a deeply nested value cannot exhaust the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not is_storable(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def holds_non_finite(value: Any) -> bool:
    """Whether a JSON-like value holds a float JSON cannot write (infinite or NaN: a parser
    reads 1e400 as infinity, and an encoder writes it back as null). Iterative, like
    ``holds_unstorable``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def storable(value: Any) -> Any:
    """``value`` with every unstorable character of its strings (and keys) replaced; the value
    itself when it holds none."""
    if not holds_unstorable(value):
        return value
    return _replace_unstorable(value)


def _replace_unstorable(value: Any) -> Any:
    # History messages have a fixed, shallow shape (arguments travel as a JSON string).
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k) if isinstance(k, str) else k: _replace_unstorable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace_unstorable(v) for v in value]
    return value


# An escape that may stand for NUL or for half of a surrogate pair; only an escape preceded by
# an even number of backslashes is one (``\\u0000`` is the text backslash-u-0-0-0-0).
_SUSPECT_ESCAPE = re.compile(rb"\\u(0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_LOW_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_HIGH_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_SURROGATE_PAIR_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def unstorable_json_text(document: bytes) -> str | None:
    """Why a string of the JSON ``document`` cannot be stored (an escaped NUL or lone
    surrogate), or ``None``. Raw NUL bytes and invalid UTF-8 are malformed JSON: its decoder
    refuses those."""
    if _SUSPECT_ESCAPE.search(document) is None:
        return None
    if b"\\u0000" not in document and b"\\\\u" not in document:  # no NUL, no backslash before a "u"
        # Text rich in escaped emoji is all proper pairs: counted in C, not one escape at a time.
        highs, lows = len(_HIGH_SURROGATE_ESCAPE.findall(document)), len(_LOW_SURROGATE_ESCAPE.findall(document))
        if highs == lows == len(_SURROGATE_PAIR_ESCAPE.findall(document)):
            return None
    position = 0
    while (match := _SUSPECT_ESCAPE.search(document, position)) is not None:
        position = match.end()
        backslashes = 0
        index = match.start() - 1
        while index >= 0 and document[index] == 0x5C:
            backslashes += 1
            index -= 1
        if backslashes % 2:  # the backslash is itself escaped: plain text "u0000"
            continue
        code = int(match[1], 16)
        if code == 0:
            return "a string contains a NUL character (\\u0000)"
        if code <= 0xDBFF and (low := _LOW_SURROGATE_ESCAPE.match(document, position)) is not None:
            position = low.end()  # a proper pair: one character
            continue
        return "a string contains a lone UTF-16 surrogate, which is not a character"
    return None


# --- bounded nesting -----------------------------------------------------------------------

# A string runs to its closing quote, or to the end of the document when it has none. Every
# match attempt succeeds and nothing backtracks (possessive quantifiers): one pass, linear.
# Requiring the closing quote made each quote of an unterminated string (`"\"\"\"...`) a
# new attempt that scanned to the end and failed: quadratic, seconds for 20 KB.
_JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
# Openers become 1 and closers -1 (0xff as a signed byte); every other byte is dropped.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def nests_deeper_than(document: bytes, max_depth: int) -> bool:
    """Whether the JSON ``document`` opens more than ``max_depth`` arrays and objects inside
    one another (brackets inside strings do not count). Linear, and done in C: the running
    depth is the running sum of +1 per opener and -1 per closer, its maximum the depth."""
    if document.count(b"[") + document.count(b"{") <= max_depth:  # the common case: cannot be deeper
        return False
    steps = array("b", _JSON_STRING.sub(b"", document).translate(_STEPS, _NOT_BRACKETS))
    return max(accumulate(steps), default=0) > max_depth


# --- the document as a whole -----------------------------------------------------------------


def json_document_problem(document: bytes, *, max_depth: int) -> str | None:
    """What is wrong with the JSON ``document`` under the three rules, in words safe to show,
    or ``None`` (also when it is not JSON at all: its decoder says so in its own words)."""
    if nests_deeper_than(document, max_depth):
        return f"it nests arrays and objects more than {max_depth} levels deep"
    problem = unstorable_json_text(document)
    if problem is not None:
        return problem
    key = repeated_key(document)
    if key is not None:
        return f"the key `{quoted(key)}` is given more than once in one object"
    return None


# --- values in range ------------------------------------------------------------------------

INT64_MAX = 2**63 - 1
"""The largest integer a PostgreSQL ``bigint`` holds."""


def in_utc(value: datetime) -> datetime | None:
    """``value`` in UTC, or ``None`` when it has no zone or cannot be: a time such as
    ``0001-01-01T00:00:00+05:00`` falls before the first instant Python can represent."""
    if value.tzinfo is None:
        return None
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return None


def out_of_range_field(value: Any, path: str = "") -> str | None:
    """The path of the first value in a decoded body that no column could hold: a zoned time
    that does not convert to UTC, an integer beyond 64 bits; or ``None``."""
    if isinstance(value, datetime):
        return path if value.tzinfo is not None and in_utc(value) is None else None
    if isinstance(value, int) and not isinstance(value, bool):
        return path if not -INT64_MAX - 1 <= value <= INT64_MAX else None
    if isinstance(value, msgspec.Struct):
        items: Any = ((name, getattr(value, name)) for name in value.__struct_fields__)
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = ((f"[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for key, item in items:
        where = out_of_range_field(item, f"{path}{key}" if str(key).startswith("[") else _join(path, str(key)))
        if where is not None:
            return where
    return None


# --- messages --------------------------------------------------------------------------------

_INVISIBLE = "\u200b\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff"
"""Bidirectional controls and invisible format characters: shown raw, U+202E turns
``"\u202e00001"`` into what reads as 10000, and a path into one that ends in ``.jpg``.
Joiners (U+200C/D, in Persian and emoji) and direction marks (U+200E/F, U+061C), which
mark text but cannot override its order, are not among them: they stay as they are."""
_UNPRINTABLE = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029{_INVISIBLE}]")
_REORDERING = re.compile(f"[{_INVISIBLE}]")


def visible(text: str) -> str:
    """``text`` with its bidirectional controls and invisible format characters written as
    ``\\u`` escapes: what a person reads is the order it holds (a page of the console)."""
    return _REORDERING.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def quoted(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` fit to appear inside a message: cut to ``limit`` characters, control
    characters, line separators, lone surrogates, bidirectional controls and invisible
    format characters written as ``\\u`` escapes (four hex digits), so a message can always be
    encoded, stored and shown on one line, in the order it holds."""
    cut = text[:limit]
    shown = _UNPRINTABLE.sub(lambda m: f"\\u{ord(m[0]):04x}", cut)
    return shown + ("…" if len(text) > limit else "")


_MALFORMED = re.compile(r"malformed: (.+) \(byte (\d+)\)$")


def decode_error_message(document: bytes, error: Exception) -> str:
    """What a JSON decoder's ``error`` means for ``document``, naming the line and column."""
    text = str(error)
    if not document.strip():
        return "it is empty"
    if text.startswith("Number out of range"):
        # JSON itself sets no bound; ours (and most parsers') is a 64-bit float: 1e400 is none.
        return "it holds a number too large for a 64-bit float"
    if "truncated" in text:
        offset, what = len(document), "it is not valid JSON: it ends too early"
    elif (match := _MALFORMED.search(text)) is not None:
        offset, what = int(match[2]), f"it is not valid JSON: {match[1]}"
    else:
        return "it is not valid JSON"
    line = document.count(b"\n", 0, offset) + 1
    column = offset - (document.rfind(b"\n", 0, offset) + 1) + 1
    return f"{what} at line {line}, column {column}"


_any_json = msgspec.json.Decoder()
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(.*)`", re.DOTALL)
_MISSING_FIELD = re.compile(r"Object missing required field `(.*)`", re.DOTALL)
_GOT = re.compile(r"Expected `object`, got `(\w+)`")
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def describe_validation_error(error: msgspec.ValidationError, target: Any, document: bytes) -> str:
    """msgspec's complaint about ``document`` in words naming the field (``limits.max_repeats``)
    and what was expected there; whatever the sender wrote is quoted escaped. A typed decoder
    stops at the first field it cannot use: a document that is not JSON at all says so first."""
    try:
        _any_json.decode(document)
    except msgspec.DecodeError as exc:
        return decode_error_message(document, exc)
    text = str(error)
    message, separator, path = text.rpartition(" - at `$")
    if not separator:
        message, path = text, ""
    path = path.rstrip("`")
    where = path.lstrip(".")
    if (match := _UNKNOWN_FIELD.fullmatch(message)) is not None:
        name = _join(where, match[1])
        fields = _field_names(_type_at(target, path))
        expected = f"; expected only {', '.join(f'`{f}`' for f in fields)}" if fields else ""
        return f"`{quoted(name)}` is not a known field{expected}"
    if (match := _MISSING_FIELD.fullmatch(message)) is not None:
        return f"`{quoted(_join(where, match[1]))}` is required"
    if message.startswith("Invalid enum value"):
        values = _literal_values(_type_at(target, path))
        return f"`{where}` must be one of {', '.join(values)}" if values else f"`{where}` is not an accepted value"
    described = message[:1].lower() + message[1:]
    if not where and (match := _GOT.fullmatch(message)) is not None:
        return f"it must be {expected_shape(target)}, not {match[1]}"
    return f"`{where}`: {described}" if where else described


def expected_shape(target: Any) -> str:
    """``a JSON object with the fields `a`, `b` (`a` required)`` for a Struct type."""
    info = _unwrap(inspect.type_info(target))
    if not isinstance(info, inspect.StructType):
        return "a JSON value"
    names = ", ".join(f"`{field.encode_name}`" for field in info.fields)
    required = [f"`{field.encode_name}`" for field in info.fields if field.required]
    return f"a JSON object with the fields {names}" + (f" ({', '.join(required)} required)" if required else "")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _unwrap(info: Any, want: tuple[type, ...] = (inspect.StructType,)) -> Any:
    while isinstance(info, inspect.Metadata):
        info = info.type
    if isinstance(info, inspect.UnionType):
        for member in info.types:
            member = _unwrap(member, want)
            if isinstance(member, want):
                return member
    return info


def _type_at(target: Any, path: str) -> Any:
    """The inspected type at msgspec's error ``path`` (``.limits.x``, ``[0]``) of ``target``."""
    info: Any = inspect.type_info(target)
    for match in _PATH_PART.finditer(path):
        if match[1] is not None:
            struct = _unwrap(info, (inspect.StructType, inspect.DictType))
            if isinstance(struct, inspect.StructType):
                info = next((f.type for f in struct.fields if f.encode_name == match[1]), None)
            elif isinstance(struct, inspect.DictType):
                info = struct.value_type
            else:
                return None
        else:
            sequence = _unwrap(info, (inspect.ListType, inspect.TupleType, inspect.VarTupleType))
            info = getattr(sequence, "item_type", None)
    return info


def _field_names(info: Any) -> list[str]:
    struct = _unwrap(info)
    return [field.encode_name for field in struct.fields] if isinstance(struct, inspect.StructType) else []


def _literal_values(info: Any) -> list[str]:
    literal = _unwrap(info, (inspect.LiteralType, inspect.EnumType))
    if isinstance(literal, inspect.LiteralType):
        return [msgspec.json.encode(value).decode() for value in literal.values]
    if isinstance(literal, inspect.EnumType):
        return [msgspec.json.encode(member.value).decode() for member in literal.cls]
    return []
