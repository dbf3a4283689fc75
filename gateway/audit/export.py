"""Encoding audit rows for the API and the export (JSON Lines or CSV), chunk by chunk.

CSV cells holding text that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return get a leading ``'`` (OWASP's rule against formula injection): a spreadsheet shows
them as text instead of running them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import msgspec

from gateway.audit.queries import EXPORT_COLUMNS, AuditFilters, stream_rows
from gateway.db.engine import Database

FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}
_JSON_COLUMNS = frozenset({"arguments", "detail"})
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_encoder = msgspec.json.Encoder()


def row_dict(row: Any) -> dict[str, Any]:
    return {name: getattr(row, name) for name in EXPORT_COLUMNS}


def encode_jsonl(rows: list[Any]) -> bytes:
    buffer = bytearray()
    for row in rows:
        _encoder.encode_into(row_dict(row), buffer, len(buffer))
        buffer += b"\n"
    return bytes(buffer)


def csv_text(value: str) -> str:
    """A text cell a spreadsheet will not run as a formula."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def _csv_value(name: str, value: Any) -> Any:
    if value is None:
        return ""
    if name in _JSON_COLUMNS:
        return csv_text(_encoder.encode(value).decode())
    if name == "created_at":
        return value.isoformat()
    if isinstance(value, str):
        return csv_text(value)
    return value


def encode_csv(rows: list[Any], *, header: bool) -> bytes:
    out = io.StringIO()
    # CRLF, as RFC 4180 has it: the writer then quotes any cell holding a CR or an LF (with
    # "\n" alone a CR in a value went out bare and split the row in two).
    writer = csv.writer(out, lineterminator="\r\n")
    if header:
        writer.writerow(EXPORT_COLUMNS)
    for row in rows:
        writer.writerow([_csv_value(name, getattr(row, name)) for name in EXPORT_COLUMNS])
    return out.getvalue().encode()


async def export_chunks(
    db: Database, *, tenant_id: str, filters: AuditFilters, fmt: str, chunk_rows: int = 1000
) -> AsyncIterator[bytes]:
    """The filtered rows, newest first, encoded a chunk at a time (never the whole table)."""
    if fmt == "csv":
        # The header goes out even when no row matches.
        yield encode_csv([], header=True)
    async with aclosing(stream_rows(db, tenant_id=tenant_id, filters=filters, chunk_rows=chunk_rows)) as chunks:
        async for rows in chunks:
            yield encode_jsonl(rows) if fmt == "jsonl" else encode_csv(rows, header=False)
