"""Small tools for tests, registered beside the built-in ones in a ``ToolRegistry`` passed to
``create_app(settings, registry=...)``. A ``Probe`` records what they did, so a test can
assert on execution itself (ran, ran concurrently, was cancelled), not on timing."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Annotated, Any, Literal

import msgspec
import sqlalchemy as sa

from gateway.services.articles import ArticleService
from gateway.tools.base import Tool, ToolContext, struct_tool
from gateway.tools.builtin import CALCULATOR_USE, Strict, builtin_tools
from gateway.tools.registry import ToolRegistry

# What the exploding tool's exception says: everything that must never reach the model.
LEAKY_DETAILS = (
    "postgresql://gateway:s3cr3t-pw@db-primary.internal.example:5432/gateway",
    "db-primary.internal.example",
    "/srv/gateway/secret_module.py",
    "SELECT password_hash FROM users",
    "s3cr3t-pw",
)
LEAKY_MESSAGE = "could not run " + " ".join(LEAKY_DETAILS)

MISSING_TABLE = "no_such_table_for_secrets"
SLEEP_TIMEOUT_S = 0.2
RENDEZVOUS_TIMEOUT_S = 3.0
BIG_RESULT_LIMIT = 64


class Probe:
    """What the test tools saw; shared between the app (which runs them) and the test."""

    def __init__(self) -> None:
        self.executions: Counter[str] = Counter()
        self.values: dict[str, Any] = {}
        """What ``keep_value`` was given, by tool_call_id: the value exactly as the handler saw it."""
        self.callers: list[tuple[str, str, str]] = []
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.arrived = 0
        self._everyone_here: asyncio.Event | None = None

    def everyone_here(self) -> asyncio.Event:
        if self._everyone_here is None:  # made in the app's event loop, on first use
            self._everyone_here = asyncio.Event()
        return self._everyone_here


class SleepArgs(Strict):
    seconds: float


class RendezvousArgs(Strict):
    parties: Annotated[int, msgspec.Meta(ge=1, le=64)]
    party: str = ""


class SizeArgs(Strict):
    size: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]


class NoteArgs(Strict):
    text: str = ""


class LoginArgs(Strict):
    username: str
    password: Annotated[str, msgspec.Meta(min_length=8)]
    vault: Literal["main", "backup"] = "main"


class ValueArgs(Strict):
    value: Any


class SecretArgs(Strict):
    name: str
    secret: str


def probe_tools(probe: Probe) -> list[Tool]:
    @struct_tool(name="sleep", description="Sleep.", arguments=SleepArgs, permission=CALCULATOR_USE,
                 timeout_s=SLEEP_TIMEOUT_S)
    async def sleep(ctx: ToolContext, args: SleepArgs) -> object:
        probe.started.append(ctx.tool_call_id)
        try:
            await asyncio.sleep(args.seconds)
        except asyncio.CancelledError:
            probe.cancelled.append(ctx.tool_call_id)
            raise
        probe.finished.append(ctx.tool_call_id)
        return {"slept": args.seconds}

    @struct_tool(name="rendezvous", description="Wait for the other parties.", arguments=RendezvousArgs,
                 permission=CALCULATOR_USE, timeout_s=RENDEZVOUS_TIMEOUT_S)
    async def rendezvous(ctx: ToolContext, args: RendezvousArgs) -> object:
        probe.arrived += 1
        if probe.arrived >= args.parties:
            probe.everyone_here().set()
        await probe.everyone_here().wait()
        return {"parties": args.parties}

    @struct_tool(name="explode", description="Fail unexpectedly.", arguments=NoteArgs, permission=CALCULATOR_USE)
    async def explode(ctx: ToolContext, args: NoteArgs) -> object:
        probe.executions[ctx.tool_call_id] += 1
        raise RuntimeError(LEAKY_MESSAGE)

    @struct_tool(name="bad_sql", description="A query that fails.", arguments=NoteArgs, permission=CALCULATOR_USE)
    async def bad_sql(ctx: ToolContext, args: NoteArgs) -> object:
        async with ctx.connection() as conn:
            await conn.execute(sa.text(f"SELECT secret_column FROM {MISSING_TABLE}"))
        return None

    @struct_tool(name="big", description="A large result.", arguments=SizeArgs, permission=CALCULATOR_USE,
                 max_result_bytes=BIG_RESULT_LIMIT)
    async def big(ctx: ToolContext, args: SizeArgs) -> object:
        return "é" * args.size

    @struct_tool(name="count", description="Count executions.", arguments=NoteArgs, permission=CALCULATOR_USE)
    async def count(ctx: ToolContext, args: NoteArgs) -> object:
        probe.executions[ctx.tool_call_id] += 1
        return {"executions": sum(probe.executions.values())}

    @struct_tool(name="login", description="Check credentials.", arguments=LoginArgs, permission=CALCULATOR_USE,
                 sensitive_fields=frozenset({"password", "vault"}))
    async def login(ctx: ToolContext, args: LoginArgs) -> object:
        probe.executions[ctx.tool_call_id] += 1
        return {"user": args.username}

    @struct_tool(name="write_note", description="A change that needs approval.", arguments=NoteArgs,
                 permission="articles:write", mutates=True)
    async def write_note(ctx: ToolContext, args: NoteArgs) -> object:
        probe.executions[ctx.tool_call_id] += 1
        probe.callers.append((ctx.principal.tenant_id, ctx.principal.user_id, ctx.idempotency_key or ""))
        await asyncio.sleep(0.05)  # long enough for concurrent approvers to overlap
        return {"written": args.text}

    @struct_tool(name="write_then_fail", description="Writes, then fails.", arguments=NoteArgs,
                 permission="articles:write", mutates=True)
    async def write_then_fail(ctx: ToolContext, args: NoteArgs) -> object:
        async with ctx.write_transaction() as conn:
            await ArticleService(conn).create(ctx.principal, title=args.text, body="half-done")
        probe.executions[ctx.tool_call_id] += 1
        raise RuntimeError("failed after writing")

    @struct_tool(name="slow_write", description="A change that takes too long.", arguments=SleepArgs,
                 permission="articles:write", mutates=True, timeout_s=SLEEP_TIMEOUT_S)
    async def slow_write(ctx: ToolContext, args: SleepArgs) -> object:
        async with ctx.write_transaction() as conn:
            await ArticleService(conn).create(ctx.principal, title="slow write", body="never committed")
        try:
            await asyncio.sleep(args.seconds)
        except asyncio.CancelledError:
            probe.cancelled.append(ctx.tool_call_id)
            raise
        return {"slept": args.seconds}

    @struct_tool(name="store_secret", description="Store a secret.", arguments=SecretArgs,
                 permission="articles:write", mutates=True, sensitive_fields=frozenset({"secret"}))
    async def store_secret(ctx: ToolContext, args: SecretArgs) -> object:
        probe.executions[ctx.tool_call_id] += 1
        return {"stored": args.name, "secret": args.secret}  # as a REST service answers the created resource

    @struct_tool(name="keep_value", description="Keep any JSON value (needs approval).", arguments=ValueArgs,
                 permission="articles:write", mutates=True)
    async def keep_value(ctx: ToolContext, args: ValueArgs) -> object:
        probe.executions[ctx.tool_call_id] += 1
        probe.values[ctx.tool_call_id] = args.value
        return {"kept": args.value}

    return [sleep, rendezvous, explode, bad_sql, big, count, login, write_note, write_then_fail, slow_write,
            store_secret, keep_value]


def registry_with_probe(probe: Probe) -> ToolRegistry:
    return ToolRegistry([*builtin_tools(), *probe_tools(probe)])
