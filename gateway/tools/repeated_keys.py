"""Finding a key given twice in one JSON object.

JSON leaves a repeated key undefined, and parsers disagree on it (the first value, the
last, an error). The gateway's decoders keep the last one silently; a service, a log
reader or an approver's tool may read the first. So a document the model sends with a
repeated key is refused, naming the key, instead of being read one way here and another
way elsewhere.
"""

from __future__ import annotations

import json
from typing import Any


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Repeated(key)
            seen.add(key)
    return value


# Made once: json.loads with a hook builds a new decoder on every call, which costs more
# than the parse of a typical call's arguments.
_decoder = json.JSONDecoder(object_pairs_hook=_unique)


def repeated_key(document: bytes) -> str | None:
    """The first key ``document`` gives twice in one object, as given (it may hold any
    character: quote it with ``gateway.text.quoted``), or ``None`` (also when it is not JSON
    at all: its decoder reports that). Callers bound the document's depth first
    (``gateway.text.json_document_problem`` does both)."""
    if document.count(b":") < 2:  # every key needs a colon: fewer than two keys in all
        return None
    try:
        _decoder.decode(document.decode())
    except _Repeated as exc:
        return exc.key
    except (ValueError, RecursionError):  # not JSON (or not UTF-8): the caller's decoder says so
        return None
    return None
