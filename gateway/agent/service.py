"""Agent runs: start one from a conversation, drive its loop, resume it after an approval.

Everything a request can get wrong is checked before the loop starts (so that a streaming
request still gets a plain HTTP error for it). The run and its history are stored as the
loop goes: the client's messages when the run starts, each round's messages after it,
and the final state (``completed``, ``stopped``, ``awaiting_approval``, ``failed`` or
``cancelled``) at the end, even when the client went away.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

from gateway.agent.history import cut_for, tool_content, validate_conversation
from gateway.agent.loop import (
    AgentLoop,
    Emit,
    LoopLimits,
    LoopOutcome,
    LoopRun,
    PendingApproval,
    approval_text,
)
from gateway.auth.directory import TenantDirectory
from gateway.auth.principal import Principal
from gateway.db import agent_runs as q
from gateway.db.engine import Database
from gateway.errors import ErrorCode, GatewayError, new_error_id
from gateway.execution.executor import ToolExecutor
from gateway.execution.protocol import ToolCallRequest
from gateway.execution.results import read_content
from gateway.tenant_turns import TenantTurns
from gateway.execution.runs import RequestedLimits, RunService
from gateway.llm.base import ChatModel, Message, SamplingOptions, Usage
from gateway.llm.providers import ModelProviders
from gateway.settings import Settings
from gateway.tools.registry import ToolRegistry

log = structlog.get_logger("gateway.agent")

_UNFINISHED = frozenset({ErrorCode.APPROVAL_REQUIRED.value, ErrorCode.TOOL_CALL_IN_PROGRESS.value})
"""What a held call answers while its approval is undecided or its approved call still runs:
the run keeps waiting (a resume later answers the stored outcome), never records it as final."""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A conversation to run, as the API layer hands it over (OpenAI chat format)."""

    messages: list[Message]
    model: str | None = None
    client_tools: list[dict[str, Any]] = field(default_factory=list)
    options: SamplingOptions = field(default_factory=SamplingOptions)
    max_steps: int | None = None
    max_total_tokens: int | None = None
    timeout_s: float | None = None
    max_tool_calls: int | None = None
    max_repeats: int | None = None


class AgentService:
    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        executor: ToolExecutor,
        registry: ToolRegistry,
        runs: RunService,
        providers: ModelProviders,
        directory: TenantDirectory,
    ) -> None:
        self._settings = settings
        self._db = db
        self._executor = executor
        self._registry = registry
        self._runs = runs
        self._providers = providers
        self._directory = directory
        self.loop = AgentLoop(
            executor=executor,
            registry=registry,
            history_share=settings.llm.history_share,
            max_batch_size=settings.requests.max_batch_size,
            save=self._save,
            turns=TenantTurns(settings.llm.max_requests_per_tenant),
        )

    @property
    def stream_stall_timeout_s(self) -> float:
        """How long a streamed answer waits for its client to take more (``gateway.api.stalled_streams``)."""
        return self._settings.server.stream_stall_timeout_s

    @property
    def provider_names(self) -> list[str]:
        return self._providers.names

    # -- starting -----------------------------------------------------------------------------

    async def start(self, principal: Principal, request: ChatRequest) -> LoopRun:
        most = self._settings.agent.chat_max_messages
        if len(request.messages) > most:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"A conversation may hold at most {most} messages (GATEWAY_CHAT_MAX_MESSAGES); "
                f"this one has {len(request.messages)}.",
            )
        tenant = await self._directory.get(principal.tenant_id)
        if tenant is None:
            raise GatewayError(ErrorCode.UNAUTHENTICATED)
        if request.client_tools and not tenant.allow_client_tools:
            raise GatewayError(ErrorCode.CLIENT_TOOLS_NOT_ALLOWED)
        problem = validate_conversation(request.messages)
        if problem is not None:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"Invalid conversation: {problem}.")
        model = self._providers.choose(request.model, pinned=tenant.llm_provider)
        tools = self._tools_for(principal, request.client_tools)
        limits = LoopLimits(
            max_steps=_lower(request.max_steps, self._settings.agent.max_steps),
            max_total_tokens=_lower(request.max_total_tokens, self._settings.agent.max_total_tokens),
            timeout_s=_lower(request.timeout_s, self._settings.agent.timeout_s),
        )
        now = datetime.now(UTC)
        row = await self._runs.create(
            principal,
            RequestedLimits(max_tool_calls=request.max_tool_calls, max_repeats=request.max_repeats),
            columns={
                "loop_state": "running",
                "provider": model.name,
                "model": model.model,
                "max_steps": limits.max_steps,
                "max_total_tokens": limits.max_total_tokens,
                "timeout_s": limits.timeout_s,
                "loop_options": {"sampling": request.options.as_dict(), "client_tools": request.client_tools},
                "updated_at": now,
            },
        )
        run = LoopRun(
            run_id=row.id,
            principal=principal,
            model=model,
            limits=limits,
            options=request.options,
            tools=tools,
            client_tool_names=frozenset(t["function"]["name"] for t in request.client_tools),
            history=list(request.messages),
        )
        await self._save(run)
        log.info("agent_run_started", run=run.run_id, provider=model.name, model=model.model,
                 max_steps=limits.max_steps, max_total_tokens=limits.max_total_tokens, timeout_s=limits.timeout_s,
                 tools=len(tools))
        return run

    def _tools_for(self, principal: Principal, client_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The caller's visible tools (roles and the tenant's tool policies) and any client tools, sorted by
        name: a stable prompt prefix, and never a tool the caller may not call."""
        names = set()
        for tool in client_tools:
            name = tool["function"]["name"]
            if self._registry.get(name) is not None or name in names:
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST, f"The client tool {name!r} clashes with another tool of that name."
                )
            names.add(name)
        visible = self._registry.visible_to(
            principal.permissions, roles=principal.roles, policies=principal.tool_policies
        )
        tools = [tool.openai_definition() for tool in visible]
        return sorted(tools + client_tools, key=lambda t: t["function"]["name"])

    # -- driving ------------------------------------------------------------------------------

    async def drive(self, run: LoopRun, *, request_id: str | None, emit: Emit | None = None) -> LoopOutcome:
        """Run the loop to its end and store how it ended, whatever happens."""
        try:
            outcome = await self.loop.run(run, request_id=request_id, emit=emit)
        except asyncio.CancelledError:
            log.info("agent_run_cancelled", run=run.run_id, steps=run.steps)
            await self._finish(run, "cancelled", None)
            raise
        except GatewayError as exc:
            log.info("agent_run_failed", run=run.run_id, code=exc.code.value, steps=run.steps)
            await self._finish(run, "failed", exc.code.value)
            raise
        except Exception:
            await self._finish(run, "failed", ErrorCode.INTERNAL_ERROR.value)
            raise
        failure = await self._finish(run, outcome.state, outcome.stop_code.value if outcome.stop_code else None)
        if failure is not None:
            raise failure  # a failed write is an error, never a 2xx
        log.info("agent_run_finished", run=run.run_id, state=outcome.state, finish_reason=outcome.finish_reason,
                 steps=run.steps, prompt_tokens=run.usage.prompt_tokens,
                 completion_tokens=run.usage.completion_tokens, messages_dropped=run.messages_dropped)
        return outcome

    # -- resuming -----------------------------------------------------------------------------

    async def resume(
        self, principal: Principal, run_id: str, *, request_id: str | None
    ) -> tuple[LoopRun, LoopOutcome | None]:
        """Answer the calls that waited for an approval from what is now stored.

        Returns the run, and an outcome when it must still wait (an approval is still pending):
        then the loop does not go on.
        """
        row = await self._runs.get(principal, run_id)
        if row.loop_state is None:
            raise GatewayError(ErrorCode.RUN_NOT_RESUMABLE, "This run is not an agent run.")
        now = datetime.now(UTC)
        async with self._db.begin() as conn:
            claimed = await q.claim_state(conn, tenant_id=principal.tenant_id, user_id=principal.user_id,
                                          run_id=run_id, expected="awaiting_approval", new="running", now=now)
        if not claimed:
            state = (await self._runs.get(principal, run_id)).loop_state
            raise GatewayError(ErrorCode.RUN_NOT_RESUMABLE, f"This run is {state}, not waiting for an approval.")
        try:
            return await self._replay_pending(principal, row, request_id=request_id)
        except BaseException:
            async with self._db.begin() as conn:
                await q.claim_state(conn, tenant_id=principal.tenant_id, user_id=principal.user_id, run_id=run_id,
                                    expected="running", new="awaiting_approval", now=datetime.now(UTC))
            raise

    async def _replay_pending(
        self, principal: Principal, row: Any, *, request_id: str | None
    ) -> tuple[LoopRun, LoopOutcome | None]:
        model = await self._resume_model(principal, row)
        history = await self._runs.history(principal, row.id)
        options = row.loop_options or {}
        client_tools = options.get("client_tools") or []
        run = LoopRun(
            run_id=row.id,
            principal=principal,
            model=model,
            limits=LoopLimits(max_steps=row.max_steps, max_total_tokens=row.max_total_tokens,
                              timeout_s=row.timeout_s),
            options=SamplingOptions.from_dict(options.get("sampling")),
            tools=self._tools_for(principal, client_tools),
            client_tool_names=frozenset(t["function"]["name"] for t in client_tools),
            history=history,
            cut=cut_for(history, row.messages_dropped),
            steps=row.steps,
            usage=Usage(prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens),
            persisted=len(history),
        )
        waiting = _waiting_calls(history)
        requests = [
            ToolCallRequest(id=call["id"], name=call["function"]["name"],
                            arguments=call["function"]["arguments"].encode())
            for _, call in waiting
        ]
        results = await self._executor.execute(principal, row.id, requests, request_id=request_id) if requests else []
        still: list[PendingApproval] = []
        async with self._db.begin() as conn:
            if model.name != row.provider:
                log.info("agent_run_provider_changed", run=row.id, provider=model.name, was=row.provider)
                await q.update_loop(conn, tenant_id=principal.tenant_id, run_id=row.id, provider=model.name,
                                    model=model.model, updated_at=datetime.now(UTC))
            for (seq, call), result in zip(waiting, results, strict=True):
                content = tool_content(result.content)
                entry = self.loop.trace_entry(run.steps, call, result.outcome, content)
                if result.outcome in _UNFINISHED:
                    still.append(PendingApproval(approval_id=result.approval_id or "", tool_call_id=call["id"],
                                                 tool=call["function"]["name"], arguments=entry.arguments))
                    continue
                history[seq] = {"role": "tool", "tool_call_id": call["id"], "content": content}
                await q.replace_message(conn, tenant_id=principal.tenant_id, run_id=row.id, seq=seq,
                                        message=history[seq])
                run.trace.append(entry)
        log.info("agent_run_resumed", run=row.id, answered=len(waiting) - len(still), still_pending=len(still))
        if still:
            failure = await self._finish(run, "awaiting_approval", ErrorCode.APPROVAL_REQUIRED.value)
            if failure is not None:
                raise failure
            return run, LoopOutcome(state="awaiting_approval", finish_reason="stop",
                                    content=approval_text(row.id, still), stop_code=ErrorCode.APPROVAL_REQUIRED,
                                    pending=still)
        return run, None

    async def _resume_model(self, principal: Principal, row: Any) -> ChatModel:
        """A resumed run follows the tenant's current pin (an operator may re-pin a tenant, for
        data residency, while its runs wait for approvals); an unpinned tenant's run keeps the
        provider it started with."""
        tenant = await self._directory.get(principal.tenant_id)
        if tenant is None:
            raise GatewayError(ErrorCode.UNAUTHENTICATED)
        if tenant.llm_provider is not None:
            model = self._providers.get(tenant.llm_provider)
            if model is None:
                raise GatewayError(
                    ErrorCode.MODEL_NOT_CONFIGURED,
                    "The model provider this tenant is pinned to is not configured on this gateway.",
                )
            return model
        model = self._providers.get(row.provider)
        if model is None:
            raise GatewayError(ErrorCode.MODEL_NOT_CONFIGURED, "The model provider of this run is no longer configured.")
        return model

    # -- storing ------------------------------------------------------------------------------

    async def _save(self, run: LoopRun) -> None:
        await self._store(run, {})

    async def _finish(self, run: LoopRun, state: str, stop_reason: str | None) -> Exception | None:
        """Store the run's end state with its last messages; returns the failure when that write failed.

        A run is never left ``running``: when the write fails (whatever made it fail would fail
        it again), the run is marked ``failed`` (``INTERNAL_ERROR``) without those messages.
        Not cut in half by a cancellation.
        """
        return await asyncio.shield(self._finish_now(run, state, stop_reason))

    async def _finish_now(self, run: LoopRun, state: str, stop_reason: str | None) -> Exception | None:
        try:
            await self._store_now(run, {"loop_state": state, "stop_reason": stop_reason})
            return None
        except Exception as exc:
            failure = exc
            log.exception("agent_run_end_state_not_stored", run=run.run_id, state=state, error_id=new_error_id())
        try:
            async with self._db.begin() as conn:
                # Only the state: the counters may be what made the first write fail.
                await q.update_loop(conn, tenant_id=run.principal.tenant_id, run_id=run.run_id, loop_state="failed",
                                    stop_reason=ErrorCode.INTERNAL_ERROR.value, updated_at=datetime.now(UTC))
        except Exception:
            log.exception("agent_run_failed_state_not_stored", run=run.run_id, error_id=new_error_id())
        return failure

    async def _store(self, run: LoopRun, values: dict[str, Any]) -> None:
        """Store the new messages and the counters. A save is never cut in half by a cancellation
        (a client going away), and saves of one run take turns, so a message is stored once."""
        await asyncio.shield(self._store_now(run, values))

    async def _store_now(self, run: LoopRun, values: dict[str, Any]) -> None:
        async with run.save_lock:
            now = datetime.now(UTC)
            fresh = run.history[run.persisted:]
            async with self._db.begin() as conn:
                await q.append_messages(conn, tenant_id=run.principal.tenant_id, run_id=run.run_id,
                                        first_seq=run.persisted, messages=fresh, now=now)
                await q.update_loop(
                    conn,
                    tenant_id=run.principal.tenant_id,
                    run_id=run.run_id,
                    steps=run.steps,
                    prompt_tokens=run.usage.prompt_tokens,
                    completion_tokens=run.usage.completion_tokens,
                    messages_dropped=run.messages_dropped,
                    updated_at=now,
                    **values,
                )
            run.persisted += len(fresh)


def _lower(requested: Any, default: Any) -> Any:
    """A request may lower a limit, never raise it."""
    return default if requested is None else min(requested, default)


def _waiting_calls(history: list[Message]) -> list[tuple[int, dict[str, Any]]]:
    """The tool messages of the last round still answered ``APPROVAL_REQUIRED``, with their calls."""
    last_assistant = max((i for i, m in enumerate(history) if m.get("role") == "assistant"), default=None)
    if last_assistant is None:
        return []
    calls = {c["id"]: c for c in history[last_assistant].get("tool_calls") or ()}
    waiting = []
    for seq in range(last_assistant + 1, len(history)):
        message = history[seq]
        if message.get("role") == "tool" and _waits_for_approval(message.get("content") or ""):
            call = calls.get(message.get("tool_call_id", ""))
            if call is not None:
                waiting.append((seq, call))
    return waiting


def _waits_for_approval(content: str) -> bool:
    """Whether a stored tool message answered ``APPROVAL_REQUIRED`` with an approval id (the
    history is all a resumed run has of its last round)."""
    if '"APPROVAL_REQUIRED"' not in content:
        return False
    try:
        error = read_content(content).error
    except msgspec.DecodeError:  # not a content the gateway wrote
        return False
    return error is not None and error.approval_id is not None
