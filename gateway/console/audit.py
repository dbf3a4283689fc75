"""The audit pages: the audit API's filters and keyset pages, its exports, and the tenant's
chain verification, read with the same query, export and verify functions as the API and
the operator's command."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import structlog
from litestar import Request, Response, get
from litestar.response import Stream

from gateway.api.audit import AUDIT_READ, _before, _cursor, _filters, export_stream, taken_slot
from gateway.audit.export import FORMATS, export_chunks
from gateway.audit.queries import page as audit_page_rows
from gateway.audit.verify import verify_chain
from gateway.console.approvals import nav_count, require
from gateway.console.web import SECURITY_HEADERS, page, services_of, signed_in
from gateway.errors import ErrorCode, GatewayError

log = structlog.get_logger("gateway.console")

FILTERS = ("user", "tool", "outcome", "run", "approval", "since", "until")
PAGE_SIZE = 50
MAX_FILTER_CHARS = 200


def filter_values(request: Request[Any, Any, Any]) -> dict[str, str]:
    """The filters given (empty fields are no filter), each at most as long as the API allows."""
    values = {}
    for name in FILTERS:
        value = request.query_params.get(name, "").strip()
        if value:
            if len(value) > MAX_FILTER_CHARS:
                raise GatewayError(ErrorCode.INVALID_REQUEST, f"The filter “{name}” is too long.")
            values[name] = value
    return values


def parsed(values: dict[str, str]) -> Any:
    return _filters(*(values.get(name) for name in FILTERS))


@get("/audit", include_in_schema=False)
async def audit_page(request: Request) -> Response[str]:
    me = await signed_in(request)
    require(me, AUDIT_READ)
    values = filter_values(request)
    error = None
    rows: list[Any] = []
    more = False
    cursor = request.query_params.get("cursor") or None
    try:
        filters = parsed(values)
        before = _before(cursor)
    except GatewayError as exc:
        error = exc.message
    else:
        async with services_of(request).db.connect() as conn:
            rows, more = await audit_page_rows(
                conn, tenant_id=me.principal.tenant_id, filters=filters, limit=PAGE_SIZE, before_id=before
            )
    query = urlencode(values)
    return page(
        "audit.html", status=400 if error else 200, me=me, pending=await nav_count(request, me), section="audit",
        rows=rows, filters=values, error=error,
        next_page=f"/console/audit?{urlencode({**values, 'cursor': _cursor(rows[-1].id)})}" if more else None,
        first_page=f"/console/audit?{query}" if cursor else None,
        exports={fmt: f"/console/audit/export?{urlencode({**values, 'format': fmt})}" for fmt in FORMATS},
    )


@get("/audit/export", include_in_schema=False)
async def audit_export(request: Request) -> Stream:
    """The API's export (same rows, same formats, same limit on exports at once) as a download."""
    me = await signed_in(request)
    require(me, AUDIT_READ)
    fmt = request.query_params.get("format", "jsonl")
    if fmt not in FORMATS:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "The export format must be jsonl or csv.")
    filters = parsed(filter_values(request))
    services = services_of(request)
    slot = taken_slot(services.audit_exports, me.principal.tenant_id, "audit exports")
    chunks = export_chunks(services.db, tenant_id=me.principal.tenant_id, filters=filters, fmt=fmt)
    return export_stream(
        chunks, slot, fmt, stall_timeout_s=services.audit_exports.stall_timeout_s,
        headers={**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="audit-{me.principal.tenant_id}.{fmt}"'},
    )


@get("/audit/verify", include_in_schema=False)
async def audit_verify(request: Request) -> Response[str]:
    """The tenant's hash chain checked from its anchor to its head (as `gateway audit verify`)."""
    me = await signed_in(request)
    require(me, AUDIT_READ)
    services = services_of(request)
    slot = taken_slot(services.audit_verifies, me.principal.tenant_id, "chain verifications")
    try:
        async with services.db.connect() as conn:
            await conn.execution_options(isolation_level="REPEATABLE READ")  # one snapshot: the sealers go on
            report = await verify_chain(conn, tenant_id=me.principal.tenant_id)
    finally:
        slot.release()
    log.info("console_audit_verified", ok=report.ok, verified_rows=report.verified_rows)
    return page("audit_verify.html", me=me, pending=await nav_count(request, me), section="audit", report=report)


HANDLERS = [audit_page, audit_export, audit_verify]
