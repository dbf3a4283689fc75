"""The audit export: rows encoded as JSON Lines or CSV, read in keyset pages, and the caps
on how many exports run at once.

Each page (``PAGE_ROWS`` rows, newest first) is read on a pooled connection in a
transaction of its own, and the connection goes back to the pool before the page is
sent: a client that reads slowly, or not at all, holds no connection, snapshot or lock
while the gateway waits on it. Pages follow each other by id (``id < last id sent``), so a
row inserted meanwhile never shifts one; the export is the rows as each page found them,
not one snapshot.

A stream that fails after its start ends with a line saying so (``failure_line``):
JSON Lines, an object ``{"error": {"code", "message", "error_id"}}`` (a row never has an
``error`` field); CSV, a row whose ``id`` cell is ``#error`` followed by the code, the
error id and the message (a row's ``id`` is otherwise always an integer).

CSV cells holding text that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return get a leading ``'`` (OWASP's rule against formula injection): a spreadsheet shows
them as text instead of running them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec

from gateway.audit.queries import EXPORT_COLUMNS, AuditFilters, page
from gateway.db.engine import Database

FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}
PAGE_ROWS = 1000
CSV_ERROR_MARKER = "#error"
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


def _csv(rows: list[list[Any]]) -> bytes:
    out = io.StringIO()
    # CRLF, as RFC 4180 has it: the writer then quotes any cell holding a CR or an LF (with
    # "\n" alone a CR in a value went out bare and split the row in two).
    csv.writer(out, lineterminator="\r\n").writerows(rows)
    return out.getvalue().encode()


def encode_csv(rows: list[Any], *, header: bool) -> bytes:
    lines: list[list[Any]] = [list(EXPORT_COLUMNS)] if header else []
    lines += [[_csv_value(name, getattr(row, name)) for name in EXPORT_COLUMNS] for row in rows]
    return _csv(lines)


def failure_line(fmt: str, *, code: str, message: str, error_id: str) -> bytes:
    """The last line of a stream that failed after it started."""
    if fmt == "csv":
        return _csv([[CSV_ERROR_MARKER, code, error_id, message]])
    return _encoder.encode({"error": {"code": code, "message": message, "error_id": error_id}}) + b"\n"


async def read_page(
    db: Database, *, tenant_id: str, filters: AuditFilters, limit: int, before_id: int | None
) -> tuple[list[Any], bool]:
    """One page in a short transaction of its own; the connection is back in the pool on
    return, also when the read is cancelled (the close is shielded from the cancellation
    that a client going away brings)."""
    conn = await db.engine.connect()
    try:
        return await page(conn, tenant_id=tenant_id, filters=filters, limit=limit, before_id=before_id)
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()


async def export_chunks(
    db: Database, *, tenant_id: str, filters: AuditFilters, fmt: str, page_rows: int = PAGE_ROWS
) -> AsyncIterator[bytes]:
    """The filtered rows, newest first, encoded a page at a time (never the whole table)."""
    if fmt == "csv":
        # The header goes out even when no row matches.
        yield encode_csv([], header=True)
    before_id: int | None = None
    while True:
        rows, more = await read_page(db, tenant_id=tenant_id, filters=filters, limit=page_rows, before_id=before_id)
        if rows:
            yield encode_jsonl(rows) if fmt == "jsonl" else encode_csv(rows, header=False)
        if not more:
            return
        before_id = rows[-1].id


class Slots:
    """How many of one kind of long task (an export, a chain verification) this process runs at
    once, per tenant and in all; one over either cap is refused (the caller answers 429)."""

    def __init__(self, *, per_tenant: int, per_process: int) -> None:
        self._per_tenant = per_tenant
        self._per_process = per_process
        self._by_tenant: dict[str, int] = {}
        self._total = 0

    @property
    def in_use(self) -> int:
        return self._total

    def take(self, tenant_id: str) -> ExportSlot | None:
        """A slot for one task of ``tenant_id``, or ``None`` when a cap is reached."""
        held = self._by_tenant.get(tenant_id, 0)
        if held >= self._per_tenant or self._total >= self._per_process:
            return None
        self._by_tenant[tenant_id] = held + 1
        self._total += 1
        return ExportSlot(self, tenant_id)

    def _give_back(self, tenant_id: str) -> None:
        self._total -= 1
        left = self._by_tenant[tenant_id] - 1
        if left:
            self._by_tenant[tenant_id] = left
        else:
            del self._by_tenant[tenant_id]


class ExportSlots(Slots):
    """The exports' slots: one is held from the request until its stream ends, fails, its
    client goes away or takes nothing for ``stall_timeout_s``."""

    def __init__(self, *, per_tenant: int, per_process: int, stall_timeout_s: float) -> None:
        super().__init__(per_tenant=per_tenant, per_process=per_process)
        self.stall_timeout_s = stall_timeout_s


class ExportSlot:
    def __init__(self, slots: Slots, tenant_id: str) -> None:
        self._slots: Slots | None = slots
        self._tenant_id = tenant_id

    def release(self) -> None:
        """Give the slot back; a second call does nothing."""
        if self._slots is not None:
            slots, self._slots = self._slots, None
            slots._give_back(self._tenant_id)
