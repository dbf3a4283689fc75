"""Path parameters, checked before any query runs."""

from __future__ import annotations

from typing import Annotated

from litestar.params import PathParameter

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
