"""`gateway ...` commands: serve, migrate, seed-demo, token, tenants, audit, chat, approvals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import secrets
import shlex
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.db.embedded import EmbeddedPostgresError, embedded_postgres
from gateway.settings import Settings, SettingsError

if TYPE_CHECKING:  # imported where used: commands start fast
    from gateway.audit.anchor import Anchor
    from gateway.auth.service_tokens import ServiceTokenSigner

DEMO_SECRET_FILE = ".gateway-demo-secret"
DEMO_SIGNING_KEY_FILE = ".gateway-demo-signing-key.pem"
DEMO_TOKEN_TTL_S = 12 * 3600


class Terminated(BaseException):
    """SIGTERM reached ``serve`` (uvicorn raises it again once it has drained): unwind, so
    that what ``serve`` started (the embedded PostgreSQL) stops, then end as SIGTERM says."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except SettingsError as exc:
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    except EmbeddedPostgresError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        return 128 + signal.SIGTERM
    except Exception as exc:
        problem = database_problem(exc)
        if problem is None:
            raise
        print(f"gateway: the database at {database_location()} failed: {problem}", file=sys.stderr)
        return 1


def database_problem(exc: BaseException) -> str | None:
    """One line for a database that cannot be reached or refuses us (down, wrong host, port,
    credentials or database name); None for anything else, which keeps its traceback."""
    import sqlalchemy.exc

    seen: set[int] = set()
    current: BaseException | None = exc
    found: BaseException | None = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        module = type(current).__module__
        if isinstance(current, OSError | TimeoutError | sqlalchemy.exc.DBAPIError | sqlalchemy.exc.TimeoutError) or (
            module.startswith("asyncpg")
        ):
            found = current  # the innermost such error says most
        current = current.__cause__ or current.__context__
    if found is None:
        return None
    if isinstance(found, sqlalchemy.exc.DBAPIError) and found.orig is not None:
        found = found.orig
    lines = str(found).strip().splitlines()
    return f"{type(found).__name__}: {lines[0]}" if lines else type(found).__name__


def database_location() -> str:
    """The configured database URL without its password."""
    from sqlalchemy.engine import make_url

    raw = os.environ.get("GATEWAY_DATABASE_URL")
    if not raw:
        return "the embedded PostgreSQL"
    try:
        return make_url(raw).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is named by the settings error, not here
        return "(unparsable GATEWAY_DATABASE_URL)"


def _port(text: str) -> int:
    """A TCP port to listen on: 1-65535 (0 would pick one at random, which no curl line could name)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def _without_password(url: str) -> str:
    from urllib.parse import unquote

    from sqlalchemy.engine import make_url

    try:
        # Unquoted for reading (the embedded server's socket folder is a query parameter).
        return unquote(make_url(url).render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - the settings took it; say nothing of it rather than all of it
        return "(configured)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="A guarded, multi-tenant tool gateway for LLM agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="apply migrations and serve the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument(
        "--workers", type=int, default=None, metavar="N",
        help="worker processes (default: GATEWAY_WORKERS, else 1); all state is in the database",
    )
    serve.add_argument(
        "--no-migrate", action="store_true",
        help="do not apply migrations at start (production: run `gateway migrate` once before the replicas)",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="demo mode: keep a generated secret in ./.gateway-demo-secret, seed the demo tenants, print tokens",
    )
    serve.set_defaults(handler=cmd_serve)

    migrate = commands.add_parser("migrate", help="apply the database migrations and exit")
    migrate.set_defaults(handler=cmd_migrate)

    seed = commands.add_parser("seed-demo", help="create the demo tenants acme and globex (idempotent)")
    seed.set_defaults(handler=cmd_seed_demo)

    token = commands.add_parser("token", help="mint a development token with GATEWAY_JWT_SECRET")
    token.add_argument("--tenant", required=True)
    token.add_argument("--user", required=True)
    token.add_argument("--role", action="append", dest="roles", metavar="ROLE",
                       help="a role (repeat for several); default: the user's roles in the directory")
    token.add_argument("--ttl", type=int, default=3600,
                       help="lifetime in seconds (default 3600; at most GATEWAY_JWT_MAX_LIFETIME_S)")
    token.add_argument("--demo", action="store_true", help=f"sign with the demo secret in ./{DEMO_SECRET_FILE}")
    token.set_defaults(handler=cmd_token)

    tenants = commands.add_parser("tenants", help="create, list, disable and enable tenants (operator)")
    tenant_commands = tenants.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    create = tenant_commands.add_parser("create", help="create a tenant with an `admin` role")
    create.add_argument("slug")
    create.add_argument("--name", help="display name (default: the slug)")
    tenant_commands.add_parser("list", help="list the tenants, their state and caps")
    for action, text in (("disable", "its tokens get 403 TENANT_DISABLED"), ("enable", "undo disable")):
        sub = tenant_commands.add_parser(action, help=text)
        sub.add_argument("slug")
    configure = tenant_commands.add_parser(
        "configure", help="the tenant's agent-loop settings: its model provider, tools clients bring"
    )
    configure.add_argument("slug")
    provider = configure.add_mutually_exclusive_group()
    provider.add_argument("--llm-provider", metavar="NAME",
                          help="pin the tenant's conversations to this configured model provider")
    provider.add_argument("--no-llm-provider", action="store_true", help="unpin: the gateway's default provider")
    configure.add_argument("--client-tools", choices=("allow", "refuse"),
                           help="whether a chat request may bring its own tools (default for a new tenant: refuse)")
    approval = tenant_commands.add_parser(
        "approval-mode", help="when a tool's calls wait for approval; only here may a tool that changes data skip it"
    )
    approval.add_argument("slug")
    approval.add_argument("tool")
    approval.add_argument("mode", choices=("never", "mutating", "always"))
    tenants.set_defaults(handler=cmd_tenants)

    audit = commands.add_parser("audit", help="the audit hash chain: seal, verify, anchor, prune (operator)")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    audit_commands.add_parser("seal", help="link every unsealed audit row into its tenant's chain now")
    verify = audit_commands.add_parser("verify", help="walk a tenant's chain; exit 1 naming the first broken row")
    verify.add_argument("--tenant", required=True)
    verify.add_argument("--anchor", metavar="FILE",
                        help="an anchor from `audit anchor`: also prove nothing up to it changed since it was taken")
    anchor = audit_commands.add_parser(
        "anchor", help="sign the tenant's sealed chain head with the service key, to keep outside the database"
    )
    anchor.add_argument("--tenant", required=True)
    anchor.add_argument("--out", metavar="FILE", help="write the anchor to FILE (default: print it)")
    prune = audit_commands.add_parser(
        "prune", help="drop the months of audit rows older than AGE (all tenants), keeping the chains verifiable"
    )
    prune.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 90d, 12h, 2w")
    # Kept so that a script written for per-tenant retention is told why it no longer works.
    prune.add_argument("--tenant", help=argparse.SUPPRESS)
    audit.set_defaults(handler=cmd_audit)
    runs = commands.add_parser("runs", help="runs' retention (operator)")
    runs_commands = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    runs_prune = runs_commands.add_parser(
        "prune", help="delete the runs that expired more than AGE ago, with their calls, messages and approvals"
    )
    runs_prune.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 2w")
    runs.set_defaults(handler=cmd_runs)
    from gateway.webhooks.operator import add_parser as add_webhooks_parser

    add_webhooks_parser(commands).set_defaults(handler=cmd_webhooks)
    from gateway.chat_cli import add_parser as add_chat_parser

    add_chat_parser(commands)
    commands.choices["chat"].set_defaults(handler=cmd_chat)
    from gateway.approvals_cli import add_parser as add_approvals_parser, cmd_approvals

    add_approvals_parser(commands)
    commands.choices["approvals"].set_defaults(handler=cmd_approvals)
    return parser


def load_settings(*, demo: bool = False) -> Settings:
    settings = Settings.from_env()
    if demo or settings.demo:
        secret = settings.jwt.secret or demo_secret(Path.cwd() / DEMO_SECRET_FILE)
        os.environ["GATEWAY_JWT_SECRET"] = secret
        os.environ["GATEWAY_DEMO"] = "true"
        if not (settings.services.signing_key or settings.services.signing_key_file):
            os.environ["GATEWAY_SERVICE_SIGNING_KEY_FILE"] = str(demo_signing_key(Path.cwd() / DEMO_SIGNING_KEY_FILE))
        return Settings.from_env()
    return settings


@contextlib.contextmanager
def with_database(settings: Settings, *, migrate: bool = True) -> Iterator[Settings]:
    """The settings with a database URL: ``GATEWAY_DATABASE_URL``, else the embedded
    PostgreSQL's, started for the command (or reused while another command runs it) and,
    being the gateway's own, migrated unless the command does that itself."""
    if settings.database.url is not None:
        yield settings
        return
    with embedded_postgres(settings.database.embedded_data_dir, announce=_say) as server:
        if migrate:
            from gateway.db.migrate import upgrade_to_head

            upgrade_to_head(server.url())
        yield msgspec.structs.replace(settings, database=msgspec.structs.replace(settings.database, url=server.url()))


def _say(line: str) -> None:
    """A notice on stderr, beside the command's own output."""
    print(f"gateway: {line}", file=sys.stderr)


def demo_secret(path: Path) -> str:
    """A random secret kept beside the demo database, so tokens survive a restart."""
    if path.exists():
        if path.stat().st_mode & 0o077:  # readable by others (copied, or made by hand): no longer
            path.chmod(0o600)
        return path.read_text().strip()
    secret = secrets.token_urlsafe(48)
    # Created private: never, even for a moment, a file others may read with the secret in it.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secret + "\n")
    return secret


def demo_signing_key(path: Path) -> Path:
    """A generated key for signing service tokens, kept like the demo secret so that services
    holding the gateway's JWKS keep verifying its tokens after a restart."""
    if not path.exists():
        from gateway.auth.service_tokens import generate_signing_key_pem

        path.touch(mode=0o600)
        path.write_bytes(generate_signing_key_pem())
    return path


def cmd_migrate(args: argparse.Namespace) -> int:
    from gateway.db.migrate import upgrade_to_head
    from gateway.logging import configure_logging

    settings = Settings.from_env()
    configure_logging(settings.log.level, settings.log.format)
    with with_database(settings, migrate=False) as settings:
        upgrade_to_head(str(settings.database.url))
    print("gateway: database is at the latest migration", file=sys.stderr)
    return 0


def cmd_seed_demo(args: argparse.Namespace) -> int:
    with with_database(Settings.from_env()) as settings:
        _seed(settings)
    print("gateway: demo tenants acme and globex are ready", file=sys.stderr)
    return 0


def _seed(settings: Settings) -> None:
    from gateway.db.engine import Database
    from gateway.demo import seed_demo

    async def run() -> None:
        db = Database.from_settings(settings)
        try:
            await seed_demo(db)
        finally:
            await db.dispose()

    asyncio.run(run())


def cmd_token(args: argparse.Namespace) -> int:
    from gateway.auth.dev_tokens import mint_token

    settings = load_settings(demo=args.demo)
    if settings.jwt.secret is None:
        raise SettingsError("GATEWAY_JWT_SECRET must be set to mint a token (or pass --demo)")
    if not 0 < args.ttl <= settings.jwt.max_lifetime_s:
        limit = settings.jwt.max_lifetime_s
        raise SettingsError(f"--ttl must be more than 0 and at most GATEWAY_JWT_MAX_LIFETIME_S ({limit})")
    roles = args.roles if args.roles else _directory_roles(settings, args.tenant, args.user)
    print(mint_token(settings, tenant_id=args.tenant, user_id=args.user, roles=roles, ttl_s=args.ttl))
    return 0


def _directory_roles(settings: Settings, tenant_id: str, user_id: str) -> list[str]:
    from gateway.db.engine import Database
    from gateway.db.tenants import user_roles

    async def run(settings: Settings) -> list[str] | None:
        db = Database.from_settings(settings)
        try:
            async with db.connect() as conn:
                return await user_roles(conn, tenant_id=tenant_id, user_id=user_id)
        finally:
            await db.dispose()

    with with_database(settings) as settings:
        roles = asyncio.run(run(settings))
    if roles is None:
        raise SettingsError(f"no user {user_id!r} in tenant {tenant_id!r}; name the roles with --role")
    return roles


def _operate(settings: Settings, action):  # type: ignore[no-untyped-def]
    """Run one operator action against the database, then close it."""
    from gateway.db.engine import Database

    async def run(settings: Settings):  # type: ignore[no-untyped-def]
        db = Database.from_settings(settings)
        try:
            return await action(db)
        finally:
            await db.dispose()

    with with_database(settings) as settings:
        return asyncio.run(run(settings))


def cmd_tenants(args: argparse.Namespace) -> int:
    from gateway.admin import operator

    settings = Settings.from_env()
    try:
        if args.tenants_command == "create":
            out = _operate(settings, lambda db: operator.create(db, args.slug, args.name))
        elif args.tenants_command == "list":
            out = _operate(settings, operator.list_all)
        elif args.tenants_command == "configure":
            out = _operate(settings, _configure_action(settings, args))
        elif args.tenants_command == "approval-mode":
            out = _operate(settings, _approval_mode_action(settings, args))
        else:
            disabled = args.tenants_command == "disable"
            out = _operate(settings, lambda db: operator.set_disabled(db, args.slug, disabled))
    except operator.OperatorError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def cmd_webhooks(args: argparse.Namespace) -> int:
    from gateway.admin.operator import OperatorError
    from gateway.logging import configure_logging
    from gateway.webhooks.operator import action

    settings = Settings.from_env()
    configure_logging(settings.log.level, settings.log.format)
    try:
        out = _operate(settings, action(args, settings.webhooks))
    except OperatorError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def _configure_action(settings: Settings, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """``tenants configure``'s options as an operator action (refused when they change nothing,
    or pin a provider this command's settings do not configure: a typo would otherwise fail
    every one of the tenant's conversations with MODEL_NOT_CONFIGURED)."""
    from gateway.admin import operator
    from gateway.llm.demo_model import DEMO_MODEL, offers_demo_model

    if args.llm_provider is None and not args.no_llm_provider and args.client_tools is None:
        raise operator.OperatorError("say what to change: --llm-provider NAME, --no-llm-provider or --client-tools")
    provider: object = operator.UNCHANGED
    if args.llm_provider is not None:
        configured = [found.name for found in settings.llm.model_providers()]
        if offers_demo_model(settings):
            configured.append(DEMO_MODEL)
        if operator.PROVIDER_NAME.fullmatch(args.llm_provider) and args.llm_provider not in configured:
            raise operator.OperatorError(
                f"no model provider {args.llm_provider!r} is configured (configured: {', '.join(configured) or 'none'});"
                " this command reads GATEWAY_LLM_* and GATEWAY_LLM_PROVIDERS as the gateway does"
            )
        provider = args.llm_provider
    elif args.no_llm_provider:
        provider = None
    client_tools = None if args.client_tools is None else args.client_tools == "allow"
    return lambda db: operator.configure(db, args.slug, llm_provider=provider, allow_client_tools=client_tools)


def _approval_mode_action(settings: Settings, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from gateway.admin import operator
    from gateway.db.policies import ApprovalMode
    from gateway.tools.config import operator_registry

    registry = operator_registry(settings)
    mode = ApprovalMode(args.mode)
    return lambda db: operator.set_approval_mode(db, args.slug, args.tool, mode, registry=registry)


PRUNE_IS_FOR_EVERY_TENANT = (
    "gateway: audit prune takes no --tenant: the tenants' audit rows share monthly partitions, and "
    "retention drops whole months for every tenant at once; run it without --tenant"
)


def cmd_audit(args: argparse.Namespace) -> int:
    from gateway.admin import operator
    from gateway.audit.anchor import AnchorInvalid
    from gateway.audit.prune import parse_age

    settings = Settings.from_env()
    try:
        if args.audit_command == "seal":
            print(_operate(settings, operator.seal))
        elif args.audit_command == "verify":
            try:
                anchor = _read_anchor(args.anchor, args.tenant) if args.anchor else None
            except AnchorInvalid as exc:
                print(f"tenant {args.tenant}: BROKEN at the signed anchor: {exc}")
                return 1
            ok, report = _operate(settings, lambda db: operator.verify(db, args.tenant, anchor))
            print(report)
            return 0 if ok else 1
        elif args.audit_command == "anchor":
            return _anchor(settings, args.tenant, args.out)
        else:
            if args.tenant is not None:
                print(PRUNE_IS_FOR_EVERY_TENANT, file=sys.stderr)
                return 2
            try:
                age = parse_age(args.older_than)
            except ValueError as exc:
                raise operator.OperatorError(str(exc)) from None
            print(_operate(settings, lambda db: operator.prune_older_than(db, age)))
    except operator.OperatorError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from gateway.admin import operator
    from gateway.audit.prune import parse_age

    try:
        age = parse_age(args.older_than)
    except ValueError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    print(_operate(Settings.from_env(), lambda db: operator.prune_runs(db, age)))
    return 0


def _signer(settings: Settings) -> ServiceTokenSigner:
    from gateway.auth.service_tokens import load_service_signer

    signer = load_service_signer(settings)
    if signer is None:
        raise SettingsError(
            "GATEWAY_SERVICE_SIGNING_KEY or GATEWAY_SERVICE_SIGNING_KEY_FILE must be set: "
            "audit anchors are signed and checked with the gateway's service key"
        )
    return signer


def _anchor(settings: Settings, tenant_id: str, out: str | None) -> int:
    from gateway.admin import operator

    signer = _signer(load_settings())
    token, report = _operate(
        settings, lambda db: operator.anchor(db, tenant_id, signer=signer, issuer=settings.services.token_issuer)
    )
    summary = (
        f"tenant {tenant_id}: anchored chain position {report.head_seq} (chain hash {report.head_hash}), "
        f"signed with key {signer.key_id}; {report.unsealed_rows} row(s) not sealed yet are not covered"
    )
    if out is None:
        print(token)
        print(summary, file=sys.stderr)
        return 0
    try:
        Path(out).write_text(token + "\n")
    except OSError as exc:
        raise operator.OperatorError(f"cannot write {out}: {exc.strerror or type(exc).__name__}") from None
    print(f"{summary}; written to {out}")
    return 0


def _read_anchor(path: str, tenant_id: str) -> Anchor:
    """The anchor in ``path``, its signature checked with the gateway's key set."""
    from gateway.admin import operator
    from gateway.audit.anchor import read_anchor

    settings = load_settings()
    signer = _signer(settings)
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise operator.OperatorError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    return read_anchor(token, jwks=signer.jwks(), issuer=settings.services.token_issuer, tenant_id=tenant_id)


def cmd_chat(args: argparse.Namespace) -> int:
    from gateway.chat_cli import ApprovalHints, request_body, run_chat

    if bool(args.question) == bool(args.resume):
        print("gateway chat: ask a question, or name a run with --resume (not both)", file=sys.stderr)
        return 2
    from gateway.api.params import RESOURCE_ID_PATTERN

    if args.resume is not None and not re.fullmatch(RESOURCE_ID_PATTERN, args.resume):
        print("gateway chat: --resume takes a run id (1-64 letters, digits, '_' or '-')", file=sys.stderr)
        return 2
    url = args.url or os.environ.get("GATEWAY_URL") or "http://127.0.0.1:8000"
    token = args.token or os.environ.get("GATEWAY_TOKEN")
    hints = ApprovalHints(console_url=url.rstrip("/") + "/console/")
    if not token:
        from gateway.auth.dev_tokens import mint_token
        from gateway.demo import DEMO_APPROVER

        settings = load_settings(demo=args.demo)
        if settings.jwt.secret is None:
            raise SettingsError("pass --token (or set GATEWAY_TOKEN), or set GATEWAY_JWT_SECRET (or --demo) to mint one")
        user = args.user or ("bob" if args.demo else "alice")
        roles = args.roles if args.roles else _directory_roles(settings, args.tenant, user)
        token = mint_token(settings, tenant_id=args.tenant, user_id=user, roles=roles, ttl_s=3600)
        hints = ApprovalHints(console_url=hints.console_url, tenant=args.tenant,
                              approver=DEMO_APPROVER if args.demo else "APPROVER")
    body = request_body(args) if args.question else None
    return run_chat(url, token, body, resume_run=args.resume, wait_s=max(0.0, args.wait), hints=hints)


def warn_about_settings(settings: Settings) -> None:
    """Log the settings that are allowed but defeat a promise the gateway makes."""
    import structlog

    from gateway.tools.http_transport import connections_per_origin

    log = structlog.get_logger("gateway.cli")
    longest_call_s = settings.tools.timeout_s + 2 * settings.database.statement_timeout_s
    if settings.server.shutdown_timeout_s < longest_call_s:
        log.warning("shutdown_timeout_shorter_than_a_call", shutdown_timeout_s=settings.server.shutdown_timeout_s,
                    longest_call_s=longest_call_s)
    per_service = connections_per_origin(settings.http.max_connections)
    if settings.tools.max_remote_calls_per_tenant >= per_service:
        # One tenant's turns leave the other tenants a connection to a slow service only while
        # they are fewer than the service's share of the pool.
        log.warning("one_tenant_can_fill_a_service",
                    tool_max_remote_calls_per_tenant=settings.tools.max_remote_calls_per_tenant,
                    connections_per_service=per_service)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.db.migrate import upgrade_to_head
    from gateway.logging import configure_logging
    from gateway.llm.demo_model import check_demo_model
    from gateway.observability.multiprocess import prepare_metrics_dir, remove_metrics_dir

    settings = load_settings(demo=args.demo)
    configure_logging(settings.log.level, settings.log.format)
    if not settings.demo:
        settings.require_signing_setup()
    check_demo_model(settings)
    workers = settings.server.workers if args.workers is None else args.workers
    if workers < 1:
        raise SettingsError("--workers must be at least 1")
    warn_about_settings(settings)
    # Before any worker imports prometheus-client: several workers share one metrics directory.
    metrics_dir = prepare_metrics_dir(workers)
    database = contextlib.ExitStack()
    signal.signal(signal.SIGTERM, _raise_terminated)  # the default action would skip the finally below
    try:
        from gateway.app import create_app

        create_app(settings)  # checks the tools file and the signing key before the database is touched
        settings = database.enter_context(with_database(settings, migrate=False))
        # The workers build their apps from the environment (gateway.asgi): the one embedded
        # server this process started serves them all, and stops after them.
        os.environ["GATEWAY_DATABASE_URL"] = str(settings.database.url)
        if not args.no_migrate:
            upgrade_to_head(str(settings.database.url))
        if settings.demo:
            _seed(settings)
            print_demo_banner(settings, args.host, args.port)
        # Every worker builds its app from the environment (gateway.asgi); demo mode has put
        # its secret there. On SIGTERM uvicorn stops accepting, lets requests in flight
        # finish (at most GATEWAY_SHUTDOWN_TIMEOUT_S), then runs the app's shutdown.
        uvicorn.run(
            "gateway.asgi:create_app_from_env",
            factory=True,
            workers=workers,
            host=args.host,
            port=args.port,
            loop="uvloop" if _has("uvloop") else "asyncio",
            http=_http_protocol(),
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=max(1, math.ceil(settings.server.shutdown_timeout_s)),
        )
    finally:
        database.close()
        remove_metrics_dir(metrics_dir)
    return 0


def _http_protocol() -> Any:
    """uvicorn's httptools protocol writing each response in one write (``gateway.http_server``),
    or h11's where httptools is not installed."""
    if not _has("httptools"):
        return "h11"
    from gateway.http_server import CoalescingHttpToolsProtocol

    return CoalescingHttpToolsProtocol


def print_demo_banner(settings: Settings, host: str, port: int) -> None:
    from gateway.auth.dev_tokens import mint_token
    from gateway.demo import DEMO_APPROVER, DEMO_TENANTS, DEMO_USERS
    from gateway.llm.demo_model import DEMO_MODEL, offers_demo_model

    base = f"http://{host}:{port}"
    out = sys.stdout
    print(f"\ngateway demo on {base}  (database: {_without_password(settings.database.url)})", file=out)
    print(f"Development tokens, valid {DEMO_TOKEN_TTL_S // 3600} h:", file=out)
    first = None
    for tenant_id in DEMO_TENANTS:
        for user in DEMO_USERS:
            token = mint_token(settings, tenant_id=tenant_id, user_id=user.id, roles=user.roles,
                               ttl_s=DEMO_TOKEN_TTL_S)
            first = first or token
            print(f"  {tenant_id}/{user.id} ({', '.join(user.roles)}):\n    {token}", file=out)
    print("\nList the tools alice may use:", file=out)
    print(f"  curl -s -H {shlex.quote('Authorization: Bearer ' + str(first))} {base}/v1/tools\n", file=out)
    print(f"Approvals console: {base}/console/  (sign in with acme/{DEMO_APPROVER}'s token, the second approver)",
          file=out)
    print(f"  in a terminal: gateway approvals list --tenant acme --as {DEMO_APPROVER}\n", file=out)
    if offers_demo_model(settings):
        print(f"Model: no GATEWAY_LLM_* is set, so the scripted demo model `{DEMO_MODEL}` answers (keyword rules,",
              file=out)
        print("not a language model). Try the agent loop, its approval pause and the resumed answer:", file=out)
        print(f"  gateway chat --demo --url {base} \"add 2 and 3, then create an article\"\n", file=out)
    print(f"API docs: {base}/schema   OpenAPI: {base}/schema/openapi.json\n", file=out, flush=True)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
