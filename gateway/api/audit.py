"""The audit API: a tenant's audit rows, filtered and paged (newest first), and their export."""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import datetime
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Controller, Request, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter
from litestar.response import Stream

from gateway.api.dependencies import principal_of
from gateway.api.errors import is_database_unavailable
from gateway.api.openapi import error_responses, streamed_text_response
from gateway.api.stalled_streams import StallLimitedStream
from gateway.audit.export import FORMATS, ExportSlot, ExportSlots, Slots, export_chunks, failure_line
from gateway.audit.queries import AuditFilters, page
from gateway.auth.guards import requires_permission
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError, new_error_id
from gateway.api.params import decode_cursor, encode_cursor, instant, parse_instant
from gateway.text import INT64_MAX

AUDIT_READ = "audit:read"
EXPORT_RETRY_AFTER_S = 5
"""What a refused export is told to wait: exports end when their clients have read them."""

log = structlog.get_logger("gateway.audit")


class AuditItem(msgspec.Struct):
    id: int
    created_at: datetime
    kind: str
    """``tool_call``, ``tool_call_replay``, ``protocol_rejection``, ``approval_decision``, ``admin_change``, ..."""
    user_id: str | None
    run_id: str | None
    tool_call_id: str | None
    tool: str | None
    arguments: Any
    """The call's arguments with sensitive fields redacted (an admin change: none)."""
    arguments_sha256: str | None
    outcome: str
    duration_ms: float | None
    approval_id: str | None
    request_id: str | None
    error_id: str | None
    detail: Any
    """For an admin change: ``{"action", "target", "before", "after"}``."""
    chain_seq: int | None
    """Position in the tenant's hash chain; ``null`` until the sealer links the row."""
    content_hash: str | None
    """``null``: the chain's hashes cover hidden values of earlier rows; ``gateway audit verify`` checks them."""
    prev_hash: str | None
    chain_hash: str | None
    hash_version: int | None
    """How ``chain_hash`` was made: 2 covers the row's time, 1 (links sealed before migration
    0022) does not ([tamper evidence](administration.md#tamper-evidence-the-hash-chain))."""


class AuditPage(msgspec.Struct):
    items: list[AuditItem]
    next_cursor: str | None = None


async def _guarded(chunks: AsyncIterator[bytes], slot: ExportSlot, fmt: str) -> AsyncIterator[bytes]:
    """The export's chunks; a failure after the response started becomes the stream's last
    line (logged with its stack under the error id that line carries). The slot is given
    back however the stream ends, the client going away included."""
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    except Exception as exc:
        error_id = new_error_id()
        code = ErrorCode.SERVICE_UNAVAILABLE if is_database_unavailable(exc) else ErrorCode.INTERNAL_ERROR
        log.error("audit_export_failed", error_id=error_id, code=code.value, format=fmt, exc_info=exc)
        yield failure_line(fmt, code=code.value, message="The export failed before its end.", error_id=error_id)
    finally:
        slot.release()


def taken_slot(slots: Slots, tenant_id: str, what: str) -> ExportSlot:
    """A slot of ``slots`` for the tenant, or ``429 RATE_LIMITED`` with ``Retry-After`` (``what``
    names the tasks in the message: "audit exports", "chain verifications")."""
    slot = slots.take(tenant_id)
    if slot is None:
        log.info("audit_task_refused", task=what, in_progress=slots.in_use)
        raise GatewayError(
            ErrorCode.RATE_LIMITED,
            f"Too many {what} in progress; retry after {EXPORT_RETRY_AFTER_S} s.",
            headers={"Retry-After": str(EXPORT_RETRY_AFTER_S)},
        )
    return slot


def _held_until_closed(chunks: AsyncIterator[bytes], slot: ExportSlot) -> AsyncIterator[bytes]:
    # A stream whose client leaves before its first chunk is never started, so its
    # ``finally`` never runs: give the slot back when the generator is collected too.
    weakref.finalize(chunks, slot.release)
    return chunks


def export_stream(
    chunks: AsyncIterator[bytes], slot: ExportSlot, fmt: str, *, stall_timeout_s: float, headers: dict[str, str]
) -> Stream:
    """The export's response (API and console alike): it holds ``slot`` until it ends, fails,
    its client goes away or takes nothing for ``stall_timeout_s``."""
    return StallLimitedStream(
        _held_until_closed(_guarded(chunks, slot, fmt), slot),
        stall_timeout_s=stall_timeout_s,
        log_fields={"stream": "audit_export", "format": fmt},
        media_type=FORMATS[fmt],
        headers=headers,
    )


class AuditCursor(msgspec.Struct, forbid_unknown_fields=True):
    before: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]


def _cursor(row_id: int) -> str:
    return encode_cursor(AuditCursor(before=row_id))


def _before(cursor: str | None) -> int | None:
    return decode_cursor(cursor, AuditCursor).before if cursor else None


def _filters(
    user: str | None, tool: str | None, outcome: str | None, run: str | None, approval: str | None,
    since: str | None, until: str | None,
) -> AuditFilters:
    return AuditFilters(
        user=user, tool=tool, outcome=outcome, run=run, approval=approval,
        since=parse_instant("since", since), until=parse_instant("until", until),
    )


def _item(row: Any) -> AuditItem:
    return AuditItem(**{name: getattr(row, name) for name in AuditItem.__struct_fields__})


Text = Annotated[str | None, QueryParameter(max_length=200)]


class AuditController(Controller):
    path = "/v1/admin/audit"
    tags = ["audit"]
    guards = [requires_permission(AUDIT_READ)]

    @get("/", summary="List the tenant's audit rows", responses=error_responses(400, 401, 403, 503))
    async def list_audit(
        self,
        request: Request,
        db: NamedDependency[Database],
        user: Text = None,
        tool: Text = None,
        outcome: Text = None,
        run: Text = None,
        approval: Text = None,
        since: instant("Rows at or after this time (RFC 3339 with zone)") = None,
        until: instant("Rows before this time (RFC 3339 with zone)") = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, QueryParameter(max_length=200)] = None,
    ) -> AuditPage:
        """Newest first; pass `next_cursor` back as `cursor` for the next page (none on the last page)."""
        principal = principal_of(request)
        filters = _filters(user, tool, outcome, run, approval, since, until)
        async with db.connect() as conn:
            rows, more = await page(
                conn, tenant_id=principal.tenant_id, filters=filters, limit=limit, before_id=_before(cursor)
            )
        return AuditPage(items=[_item(row) for row in rows], next_cursor=_cursor(rows[-1].id) if more else None)

    @get(
        "/export",
        summary="Export the tenant's audit rows (JSON Lines or CSV)",
        responses=error_responses(400, 401, 403, 429, 503),
        operation_class=streamed_text_response(
            {
                "application/x-ndjson": "format=jsonl: one JSON object per row, the fields of an audit item; "
                "a stream that fails ends with `{\"error\": {\"code\", \"message\", \"error_id\"}}`.",
                "text/csv": "format=csv: a header line, then one line per row (text cells starting with = + - @ "
                "tab or CR prefixed with '); a stream that fails ends with a row `#error,<code>,<error_id>,<message>`.",
            },
            "The matching rows, newest first, streamed.",
        ),
    )
    async def export_audit(
        self,
        request: Request,
        db: NamedDependency[Database],
        audit_exports: NamedDependency[ExportSlots],
        format: Annotated[str, QueryParameter(description="jsonl or csv", schema_extra={"enum": list(FORMATS)})] = "jsonl",
        user: Text = None,
        tool: Text = None,
        outcome: Text = None,
        run: Text = None,
        approval: Text = None,
        since: instant("Rows at or after this time (RFC 3339 with zone)") = None,
        until: instant("Rows before this time (RFC 3339 with zone)") = None,
    ) -> Stream:
        """Streams every matching row, newest first, in pages read one short transaction at a time.
        A tenant (and a process) runs a bounded number of exports at once: one more is 429."""
        if format not in FORMATS:
            raise GatewayError(ErrorCode.INVALID_REQUEST, "format must be jsonl or csv.")
        principal = principal_of(request)
        filters = _filters(user, tool, outcome, run, approval, since, until)
        slot = taken_slot(audit_exports, principal.tenant_id, "audit exports")
        chunks = export_chunks(db, tenant_id=principal.tenant_id, filters=filters, fmt=format)
        return export_stream(
            chunks, slot, format, stall_timeout_s=audit_exports.stall_timeout_s,
            headers={"Content-Disposition": f'attachment; filename="audit-{principal.tenant_id}.{format}"'},
        )
