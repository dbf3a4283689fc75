"""Path and query parameters and cursors, checked before any query runs."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Annotated, Any, TypeVar

import msgspec
from litestar.params import PathParameter, QueryParameter

from gateway.errors import ErrorCode, GatewayError
from gateway.text import in_utc, out_of_range_field

T = TypeVar("T")

RESOURCE_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

ResourceId = Annotated[
    str,
    PathParameter(
        pattern=RESOURCE_ID_PATTERN,
        description="An id this API gave out (letters, digits, `_` and `-`).",
    ),
]
"""An id that cannot exist (NUL, other characters, too long) is a 400, never a database error."""

NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"

Name = Annotated[
    str,
    PathParameter(pattern=NAME_PATTERN, description="A role's or tool's name (letters, digits, `_`, `-`, `.`, `:`)."),
]
"""A name that cannot exist (NUL, other characters, too long) is a 400, never a database error."""


def instant(description: str) -> Any:
    """A query parameter naming a point in time: RFC 3339 text with a zone
    (``2026-01-31T00:00:00Z``), read by ``parse_instant``. Typed as text so that nothing
    else (a bare number such as ``0.5``) is read as a time on the way in."""
    return Annotated[str | None, QueryParameter(format="date-time", max_length=64, description=description)]


def parse_instant(name: str, value: str | None) -> datetime | None:
    """The ``instant`` parameter ``name`` in UTC; text that is not an RFC 3339 time with a zone,
    or a time that does not exist in UTC (``0001-01-01T00:00:00+05:00``), is a 400."""
    if value is None:
        return None
    try:
        parsed = msgspec.convert(value, datetime, strict=True)
    except msgspec.ValidationError:
        parsed = None
    utc = in_utc(parsed) if parsed is not None else None
    if utc is None:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"{name} must be an RFC 3339 time with a zone between years 1 and 9999 (e.g. 2026-01-31T00:00:00Z).",
        )
    return utc


CURSOR_MAX_LENGTH = 200


def decode_cursor(cursor: str, shape: type[T]) -> T:
    """A cursor this API gave out: base64url of the JSON of ``shape``, whose types bound every
    value (ids by pattern, numbers by range). Anything else, or a time that does not exist in
    UTC, is a 400 naming no part of it."""
    refused = GatewayError(ErrorCode.INVALID_REQUEST, "The cursor is not one this API gave out.")
    if len(cursor) > CURSOR_MAX_LENGTH:
        raise refused
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = msgspec.json.decode(raw, type=shape, strict=True)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise refused from None
    if out_of_range_field(value) is not None:
        raise refused
    return value


def encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(value)).decode().rstrip("=")
