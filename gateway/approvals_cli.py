"""``gateway approvals list|show|approve|reject``: deciding approvals from a terminal.

    gateway approvals list --tenant T --as USER [--status S] [--limit N] [--json]
    gateway approvals show ID --tenant T --as USER [--reveal] [--json]
    gateway approvals approve ID --tenant T --as USER [--json]
    gateway approvals reject ID --reason TEXT|- --tenant T --as USER [--json]

An operator command, like ``gateway tenants``: it runs with the gateway's database
credentials, the trust every operator command rests on. ``--as`` names the approver, a user of
the tenant's directory whose roles there grant ``approvals:decide``; the principal is built
from the directory exactly as a token's would be, and the decision goes through the same
``ApprovalService`` as ``/v1/admin/approvals`` (self-approval refused, executed at most once,
the same audit rows, the approver named in them). A token would prove nothing more here:
checking one locally needs the secret that mints one.

Exit status: 0 done, 1 refused (the stable error code is printed), 2 usage (a malformed id,
reason, tenant or user is ``INVALID_REQUEST``, refused before the database is touched).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.errors import ErrorCode, GatewayError
from gateway.settings import Settings, SettingsError
from gateway.text import is_storable, quoted

if TYPE_CHECKING:
    from gateway.db.engine import Database
    from gateway.execution.approvals import ApprovalService

STATUSES = ("pending", "executing", "succeeded", "failed", "rejected", "expired")
MAX_REASON_STDIN_BYTES = 64 * 1024


class UsageError(Exception):
    """The command line is wrong; the message says what."""


def add_parser(commands: Any) -> None:
    approvals = commands.add_parser(
        "approvals", help="list, show, approve and reject approvals as a named approver of a tenant (operator)"
    )
    actions = approvals.add_subparsers(dest="approvals_command", required=True, metavar="ACTION")
    who = argparse.ArgumentParser(add_help=False)
    who.add_argument("--tenant", required=True, help="the tenant whose approvals these are")
    who.add_argument("--as", dest="approver", required=True, metavar="USER",
                     help="the approver: a user of the tenant whose roles grant approvals:decide")
    who.add_argument("--json", action="store_true", help="print JSON (the API's approval objects) for scripts")
    listing = actions.add_parser("list", parents=[who], help="the tenant's approvals, newest first")
    listing.add_argument("--status", choices=STATUSES, help="only approvals in this state")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (1-200, default 50)")
    show = actions.add_parser("show", parents=[who], help="one approval: the frozen call, its state and outcome")
    show.add_argument("approval_id", metavar="ID")
    show.add_argument("--reveal", action="store_true",
                      help="show the tool's sensitive arguments too (audited as approval_reveal)")
    approve = actions.add_parser("approve", parents=[who], help="approve: the frozen call runs once, as its requester")
    approve.add_argument("approval_id", metavar="ID")
    reject = actions.add_parser("reject", parents=[who], help="reject: the call answers APPROVAL_REJECTED")
    reject.add_argument("approval_id", metavar="ID")
    reject.add_argument("--reason", required=True, help="why (1-1000 characters); `-` reads it from standard input")


def cmd_approvals(args: argparse.Namespace) -> int:
    from gateway.cli import _operate
    from gateway.logging import configure_logging

    try:
        request = _checked(args)
    except UsageError as exc:
        return _refused(args, ErrorCode.INVALID_REQUEST, str(exc), status=2)
    settings = Settings.from_env()
    configure_logging(settings.log.level, settings.log.format)  # on stderr: stdout is the command's answer
    try:
        rows, service = _operate(settings, lambda db: _run(db, settings, request))
    except GatewayError as exc:
        return _refused(args, exc.code, exc.message, status=1)
    _print(args, rows, service)
    return 0


class _Request(msgspec.Struct, frozen=True):
    action: str
    tenant: str
    approver: str
    approval_id: str | None = None
    reason: str | None = None
    status: str | None = None
    limit: int = 50
    reveal: bool = False


def _checked(args: argparse.Namespace) -> _Request:
    """The command line as a request, every value checked as the API would check it."""
    for label, value, longest in (("--tenant", args.tenant, 64), ("--as", args.approver, 128)):
        if not value or len(value) > longest or not is_storable(value):
            raise UsageError(f"{label} must be 1-{longest} characters a database can store")
    from gateway.api.params import RESOURCE_ID_PATTERN

    approval_id = getattr(args, "approval_id", None)
    if approval_id is not None and not re.fullmatch(RESOURCE_ID_PATTERN, approval_id):
        raise UsageError("an approval id is 1-64 letters, digits, '_' or '-'")
    reason = getattr(args, "reason", None)
    if reason == "-":
        reason = sys.stdin.buffer.read(MAX_REASON_STDIN_BYTES + 1).decode("utf-8", errors="surrogateescape")
        reason = reason.removesuffix("\n")
    if reason is not None:
        from gateway.api.schemas import RejectBody

        try:
            msgspec.convert({"reason": reason}, RejectBody)  # the API's rule for a reason
        except msgspec.ValidationError:
            raise UsageError("--reason must be 1-1000 characters, without NUL") from None
        if not is_storable(reason):  # what a command line adds: bytes that are not UTF-8
            raise UsageError("--reason must be valid UTF-8")
    limit = getattr(args, "limit", 50)
    if not 1 <= limit <= 200:
        raise UsageError("--limit must be 1-200")
    return _Request(
        action=args.approvals_command, tenant=args.tenant, approver=args.approver, approval_id=approval_id,
        reason=reason, status=getattr(args, "status", None), limit=limit, reveal=getattr(args, "reveal", False),
    )


async def _run(db: Database, settings: Settings, request: _Request) -> tuple[list[Any], ApprovalService]:
    from gateway.auth.directory import TenantDirectory
    from gateway.auth.principal import Principal
    from gateway.db.tenants import user_roles
    from gateway.execution.approvals import ApprovalService
    from gateway.observability.metrics import Metrics

    directory = TenantDirectory(db, ttl_s=0)
    async with db.connect() as conn:
        roles = await user_roles(conn, tenant_id=request.tenant, user_id=request.approver)
    record = await directory.get(request.tenant)
    if record is None or roles is None:
        raise GatewayError(ErrorCode.UNAUTHENTICATED, f"No user {request.approver!r} in tenant {request.tenant!r}.")
    if record.disabled:
        raise GatewayError(ErrorCode.TENANT_DISABLED)
    approver = await directory.principal(request.tenant, request.approver, list(roles))
    assert isinstance(approver, Principal)
    if not approver.has("approvals:decide"):
        raise GatewayError(ErrorCode.FORBIDDEN, "This action needs the permission 'approvals:decide'.")
    request_id = "req_" + os.urandom(16).hex()  # ties the audit rows and the logs of this command together
    async with _ServiceTools(settings) as registry:
        service = ApprovalService(settings=settings, db=db, registry=registry, directory=directory, metrics=Metrics())
        if request.action == "list":
            return await service.list(approver, status=request.status, limit=request.limit, after=None), service
        assert request.approval_id is not None
        if request.action == "show":
            row = await service.get_for_approver(approver, request.approval_id, reveal=request.reveal,
                                                 request_id=request_id)
        elif request.action == "approve":
            pending = await service.get(approver, request.approval_id)
            if pending.status == "pending" and registry.get(pending.tool) is None:
                # Approving claims the call once: run here without its tool, it would be spent on
                # TOOL_NOT_FOUND. An MCP server's tools live in a running gateway only.
                raise GatewayError(
                    ErrorCode.TOOL_NOT_FOUND,
                    f"This command knows the built-in and HTTP tools only, not {quoted(pending.tool, 128)}: "
                    "approve this call in the console or through the API of a running gateway.",
                )
            row = await service.approve(approver, request.approval_id, request_id=request_id)
        else:
            assert request.reason is not None
            row = await service.reject(approver, request.approval_id, request.reason, request_id=request_id)
        return [row], service


class _ServiceTools:
    """The gateway's tools as ``gateway serve`` builds them, able to call their services while
    the command runs: approving an HTTP tool's call executes it here."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    async def __aenter__(self) -> Any:
        import httpx

        from gateway.auth.service_tokens import load_service_signer
        from gateway.tools.builtin import builtin_tools
        from gateway.tools.config import load_http_tools
        from gateway.tools.http import ServiceCalls
        from gateway.tools.http_transport import service_transport
        from gateway.tools.registry import ToolRegistry

        settings = self._settings
        self._calls = ServiceCalls(load_service_signer(settings),
                                   max_calls_per_tenant=settings.tools.max_remote_calls_per_tenant)
        registry = ToolRegistry(builtin_tools())
        http_tools = load_http_tools(settings, self._calls, reserved_names=(tool.name for tool in registry))
        if http_tools and self._calls.signer is None:
            raise SettingsError(
                "the tools file declares HTTP tools: set GATEWAY_SERVICE_SIGNING_KEY or "
                "GATEWAY_SERVICE_SIGNING_KEY_FILE, as for `gateway serve` (an approved call runs here)"
            )
        for tool in http_tools:
            registry.register(tool)
        transport = service_transport(limits=httpx.Limits(max_connections=4, max_keepalive_connections=0))
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.tools.timeout_s, connect=settings.http.connect_timeout_s),
            transport=transport,
            follow_redirects=False,
        )
        self._calls.attach(self._http, transport)
        return registry

    async def __aexit__(self, *exc: object) -> None:
        self._calls.detach()
        await self._http.aclose()


def _refused(args: argparse.Namespace, code: ErrorCode, message: str, *, status: int) -> int:
    print(f"gateway: {code.value}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(msgspec.json.encode({"error": {"code": code.value, "message": message}}).decode())
    return status


def _print(args: argparse.Namespace, rows: list[Any], service: ApprovalService) -> None:
    from gateway.api.approvals import approval_view

    now = datetime.now(UTC)
    reveal = bool(getattr(args, "reveal", False))
    views = [approval_view(row, service, now, reveal=reveal) for row in rows]
    if args.json:
        payload: Any = {"items": views} if args.approvals_command == "list" else views[0]
        print(msgspec.json.encode(payload).decode())
        return
    if args.approvals_command == "list":
        if not views:
            print(f"no approvals in tenant {args.tenant}" + (f" with status {args.status}" if args.status else ""))
        for view in views:
            print(f"{view.id}  {view.status:<9}  {_shown(view.tool)}  requested by {_shown(view.requested_by)} "
                  f"at {view.requested_at:%Y-%m-%d %H:%M:%S}Z  (run {view.run_id})")
        return
    view = views[0]
    if args.approvals_command == "approve":
        code = view.outcome.code if view.outcome is not None else view.status
        ended = "and succeeded" if view.status == "succeeded" else f"and ended {code}"
        print(f"approved {view.id}: {_shown(view.tool)} ran as {_shown(view.requested_by)} {ended}")
    elif args.approvals_command == "reject":
        print(f"rejected {view.id}: {_shown(view.tool)} answers APPROVAL_REJECTED")
    _show(view)


def _shown(text: object) -> str:
    """Text from requesters, models and services, fit for a terminal: control characters and
    line separators escaped, so nothing it holds can move the cursor or forge a line."""
    return quoted(str(text), 4000)


def _show(view: Any) -> None:
    arguments = _shown(msgspec.json.encode(view.arguments).decode())
    lines = [
        f"approval   {view.id}",
        f"status     {view.status}",
        f"tool       {_shown(view.tool)}",
        f"arguments  {arguments}",
        f"requested  by {_shown(view.requested_by)} at {view.requested_at:%Y-%m-%d %H:%M:%S}Z (run {view.run_id}, "
        f"call {_shown(view.tool_call_id)})",
        f"expires    {view.expires_at:%Y-%m-%d %H:%M:%S}Z",
    ]
    if view.redacted_fields:
        lines.append(f"hidden     {', '.join(view.redacted_fields)} (show --reveal to see them; audited)")
    if view.decided_by:
        decided = f" at {view.decided_at:%Y-%m-%d %H:%M:%S}Z" if view.decided_at else ""
        lines.append(f"decided    by {_shown(view.decided_by)}{decided}")
    if view.reason:
        lines.append(f"reason     {_shown(view.reason)}")
    if view.outcome is not None:
        outcome = view.outcome
        detail = msgspec.json.encode(outcome.result).decode() if outcome.ok else (
            f"{outcome.error.message}" if outcome.error is not None else "")
        lines.append(f"outcome    {outcome.code} {_shown(detail)}")
    print("\n".join(lines))
