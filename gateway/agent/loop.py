"""The agent loop: rounds of "ask the model, run the tools it asked for" until it answers.

One round: trim the history to the context window; send it with the tools (sorted by
name, so the prompt prefix stays stable); append the assistant message; if it has no
``tool_calls`` it is the answer (``finish_reason`` is only logged when it disagrees);
otherwise check each call by the protocol rules of a tool-call batch, then run every call
through the guarded executor (the same codes, budget, repeats, replays, approvals and
audit as ``POST /v1/runs/{id}/tool-calls``; a call that broke a rule is answered with its
code there, audited and not run) and append one ``role=tool`` message per call, aligned
by id.

Limits, each reported with its own code: ``max_steps`` (model round trips:
``MAX_STEPS_EXCEEDED``), ``max_total_tokens`` (input + output from the provider's usage,
checked after each answer: ``TOKEN_BUDGET_EXCEEDED``) and the wall clock (``RUN_TIMEOUT``,
which cancels the model request or the tools in flight). The calls of an answer that
cannot be followed by another round are not run; they are answered with the stop code,
so the history stays well formed. A call that needs an approval stops the loop with what
is pending.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from gateway.tenant_turns import TenantTurns
from gateway.agent.history import (
    PromptBudget,
    close_open_calls,
    dropped_count,
    tool_content,
    trim,
)
from gateway.auth.principal import Principal
from gateway.text import MAX_JSON_DEPTH_CEILING, nests_deeper_than, quoted, storable, storable_text
from gateway.errors import ErrorCode
from gateway.execution.executor import ToolExecutor
from gateway.execution.protocol import (
    MAX_TOOL_NAME_LENGTH,
    FunctionCallIn,
    ProtocolError,
    ToolCallIn,
    ToolCallRequest,
    call_problem,
    id_problem,
)
from gateway.llm.base import ChatModel, ChatResult, Message, SamplingOptions, UpstreamError, Usage, new_tool_call_id
from gateway.tools.base import REDACTED
from gateway.tools.registry import ToolRegistry

log = structlog.get_logger("gateway.agent")

Emit = Callable[[dict[str, Any]], Awaitable[None]]
Save = Callable[["LoopRun"], Awaitable[None]]

MODEL_CALLS_CEILING = 2
"""An answer with up to this many times the batch limit of calls has the calls past the limit
answered ``INVALID_TOOL_CALL`` (the model can try again with fewer); more, and the whole
answer is ``UPSTREAM_BAD_RESPONSE``."""


@dataclass(frozen=True, slots=True)
class LoopLimits:
    max_steps: int
    max_total_tokens: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class TraceEntry:
    round: int
    tool_call_id: str
    name: str
    arguments: Any
    """The model's arguments, sensitive fields redacted."""
    outcome: str
    content: str
    approval_id: str | None = None


@dataclass(frozen=True, slots=True)
class PendingApproval:
    approval_id: str
    tool_call_id: str
    tool: str
    arguments: Any


@dataclass(slots=True)
class LoopRun:
    """One agent run as the loop drives it; ``persisted`` history messages are stored."""

    run_id: str
    principal: Principal
    model: ChatModel
    limits: LoopLimits
    options: SamplingOptions
    tools: list[dict[str, Any]]
    client_tool_names: frozenset[str]
    history: list[Message]
    cut: int = 0
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    persisted: int = 0
    trace: list[TraceEntry] = field(default_factory=list)
    save_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def messages_dropped(self) -> int:
        return dropped_count(self.history, self.cut)


@dataclass(slots=True)
class LoopOutcome:
    state: str
    """``completed``, ``stopped`` (a limit) or ``awaiting_approval``."""
    finish_reason: str
    content: str
    stop_code: ErrorCode | None = None
    pending: list[PendingApproval] = field(default_factory=list)
    client_tool_calls: list[dict[str, Any]] = field(default_factory=list)


async def _no_emit(event: dict[str, Any]) -> None:
    return None


class AgentLoop:
    def __init__(
        self, *, executor: ToolExecutor, registry: ToolRegistry, history_share: float, max_batch_size: int, save: Save,
        turns: TenantTurns,
    ) -> None:
        self._executor = executor
        self._turns = turns
        self._max_batch_size = max_batch_size
        self._registry = registry
        self._history_share = history_share
        self._save = save

    async def run(self, run: LoopRun, *, request_id: str | None, emit: Emit | None = None) -> LoopOutcome:
        emit = emit or _no_emit
        deadline = asyncio.get_running_loop().time() + run.limits.timeout_s
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                return await self._rounds(run, deadline, request_id, emit)
        except TimeoutError:
            if not scope.expired():
                raise
        closing = close_open_calls(run.history, ErrorCode.RUN_TIMEOUT, "Not finished: the run reached its time limit.")
        await self._trace_unrun(run, closing, ErrorCode.RUN_TIMEOUT, emit)
        return self._stopped(run, ErrorCode.RUN_TIMEOUT)

    async def _rounds(self, run: LoopRun, deadline: float, request_id: str | None, emit: Emit) -> LoopOutcome:
        tools_chars = len(msgspec.json.encode(run.tools))
        budget = PromptBudget(max_tokens=int(run.model.context_window * self._history_share))
        while True:
            if run.steps >= run.limits.max_steps:
                return self._stopped(run, ErrorCode.MAX_STEPS_EXCEEDED)
            dropped_before = run.messages_dropped
            trimmed = trim(run.history, cut=run.cut, budget=budget, tools_chars=tools_chars)
            prompt, run.cut = trimmed.prompt, trimmed.cut
            if run.messages_dropped > dropped_before:
                log.info("history_trimmed", run=run.run_id, dropped=run.messages_dropped - dropped_before,
                         messages_dropped=run.messages_dropped)
            round_no = run.steps + 1
            await emit({"type": "round", "round": round_no, "messages_dropped": run.messages_dropped})
            prompt_chars = trimmed.prompt_chars + tools_chars
            started = time.perf_counter()
            async with self._turns.turn(run.principal.tenant_id):
                result = await run.model.chat(prompt, run.tools, options=run.options, deadline=deadline)
            run.steps = round_no
            run.usage = run.usage + result.usage  # billed, even for an answer refused below
            sent = len(result.message.tool_calls)
            if sent > MODEL_CALLS_CEILING * self._max_batch_size:
                # Each call is answered, audited and stored: 20,000 calls in one answer would be
                # as many rows of each. An answer this far past the limit is not a model's slip.
                log.warning("model_tool_calls_refused", run=run.run_id, sent=sent, limit=self._max_batch_size)
                raise UpstreamError(
                    ErrorCode.UPSTREAM_BAD_RESPONSE,
                    f"The model's answer holds {sent} tool calls, more than twice the {self._max_batch_size} "
                    "one answer may hold.",
                )
            budget.calibrate(prompt_chars, result.usage.prompt_tokens)
            assistant, requests = self._assistant_message(run, result)
            run.history.append(assistant)
            calls: list[dict[str, Any]] = assistant.get("tool_calls", [])
            self._log_answer(run, result, calls, started)

            if not calls:
                finish = result.finish_reason if result.finish_reason in ("stop", "length", "content_filter") else "stop"
                return LoopOutcome(state="completed", finish_reason=finish, content=result.message.content or "")
            await emit({"type": "assistant", "round": round_no, "content": assistant["content"],
                        "tool_calls": [{"id": c["id"], "name": c["function"]["name"]} for c in calls]})
            if run.usage.total_tokens > run.limits.max_total_tokens:
                return await self._stop_with_open_calls(run, ErrorCode.TOKEN_BUDGET_EXCEEDED, emit)
            if run.steps >= run.limits.max_steps:
                return await self._stop_with_open_calls(run, ErrorCode.MAX_STEPS_EXCEEDED, emit)

            client_calls = [c for c, r in zip(calls, requests, strict=True)
                            if r.rejected is None and r.name in run.client_tool_names]
            if client_calls:
                own = [r for r in requests if r.rejected is not None or r.name not in run.client_tool_names]
                return await self._hand_back(run, assistant, client_calls, own, request_id)

            pending = await self._execute(run, calls, requests, round_no, request_id, emit)
            if pending:
                log.info("agent_run_awaiting_approval", run=run.run_id, approvals=[p.approval_id for p in pending])
                return LoopOutcome(
                    state="awaiting_approval",
                    finish_reason="stop",
                    content=approval_text(run.run_id, pending),
                    stop_code=ErrorCode.APPROVAL_REQUIRED,
                    pending=pending,
                )
            await self._save(run)  # another round follows; the end state is stored by the caller

    def _assistant_message(self, run: LoopRun, result: ChatResult) -> tuple[Message, list[ToolCallRequest]]:
        """The model's answer as history keeps it, and the calls to execute, aligned.

        Each call is checked by the rules of a tool-call batch (``call_problem``), one at a
        time: one that breaks them, or shares its id with another call of the answer, is
        answered with the route's code and never run; so is each call past the batch limit
        (``INVALID_TOOL_CALL``), which stays in the message so that every call is answered. A call gets a fresh id when it has
        none, one that cannot be stored, or one used before in the run. Text PostgreSQL
        cannot store is replaced in what history keeps; the calls run with what was sent.
        """
        model_calls = result.message.tool_calls
        if len(model_calls) > self._max_batch_size:
            # Every call of an assistant message must be answered by a tool message, or the
            # next round is malformed: the calls past the limit stay in history, answered
            # with INVALID_TOOL_CALL, audited, and never run.
            log.warning("model_tool_calls_over_limit", run=run.run_id, sent=len(model_calls),
                        limit=self._max_batch_size)
        used = {c["id"] for m in run.history if m.get("role") == "assistant" for c in m.get("tool_calls") or ()}
        repeated = {i for i, n in Counter(c.id for c in model_calls if c.id is not None).items() if n > 1}
        calls: list[dict[str, Any]] = []
        requests: list[ToolCallRequest] = []
        for index, call in enumerate(model_calls):
            where = f"tool_calls[{index}]"
            usable = call.id is not None and id_problem(call.id, where) is None
            call_id = call.id if usable and call.id not in used else new_tool_call_id()
            used.add(call_id)
            problem = call_problem(
                ToolCallIn(id=call.id if call.id is not None else call_id, type=call.type,
                           function=FunctionCallIn(name=call.name, arguments=call.arguments)),
                where,
            )
            if index >= self._max_batch_size:
                problem = ProtocolError(
                    ErrorCode.INVALID_TOOL_CALL,
                    f"{where} is past the {self._max_batch_size} tool calls one answer may hold; it was not run.",
                )
            if problem is None and call.id in repeated:
                problem = ProtocolError(ErrorCode.DUPLICATE_TOOL_CALL_ID,
                                        f"{where}.id repeats the id of another call of this answer.")
            name = storable_text(call.name or "")
            arguments = call.arguments.encode("utf-8", "surrogatepass")
            if problem is None:
                requests.append(ToolCallRequest(id=call_id, name=call.name or "", arguments=arguments))
            else:
                log.info("model_tool_call_refused", run=run.run_id, tool_call_id=call_id, code=problem.code.value)
                requests.append(ToolCallRequest(id=call_id, name=name[:MAX_TOOL_NAME_LENGTH], arguments=arguments,
                                                rejected=(problem.code, problem.message)))
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": call.arguments}})
        message: Message = {"role": "assistant", "content": result.message.content or ""}
        if calls:
            message["tool_calls"] = calls
        return storable(message), requests

    def _log_answer(self, run: LoopRun, result: ChatResult, calls: list[dict[str, Any]], started: float) -> None:
        disagrees = (bool(calls) and result.finish_reason not in (None, "tool_calls")) or (
            not calls and result.finish_reason == "tool_calls"
        )
        if disagrees:
            # The decision is made on tool_calls alone; some servers say "stop" while asking for tools.
            log.info("finish_reason_disagrees", run=run.run_id, finish_reason=quoted(result.finish_reason or "", 64),
                     tool_calls=len(calls))
        log.info(
            "model_answered",
            run=run.run_id,
            provider=run.model.name,
            model=quoted(result.model, 128),  # the model server's words: a line of the log, not its size
            round=run.steps,
            tool_calls=len(calls),
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
        )

    async def _execute(
        self,
        run: LoopRun,
        calls: list[dict[str, Any]],
        requests: list[ToolCallRequest],
        round_no: int,
        request_id: str | None,
        emit: Emit,
    ) -> list[PendingApproval]:
        for call in calls:
            await emit({"type": "tool_call", "round": round_no, "tool_call_id": call["id"],
                        "name": call["function"]["name"], "arguments": self.shown_arguments(call)})
        results = await self._executor.execute(run.principal, run.run_id, requests, request_id=request_id)
        pending = []
        for call, result in zip(calls, results, strict=True):
            content = tool_content(result.content)
            run.history.append({"role": "tool", "tool_call_id": call["id"], "content": content})
            approval_id = result.approval_id if result.outcome == ErrorCode.APPROVAL_REQUIRED.value else None
            entry = self.trace_entry(round_no, call, result.outcome, content, approval_id)
            run.trace.append(entry)
            await emit(trace_event(entry))
            if approval_id is not None:
                pending.append(PendingApproval(approval_id=approval_id, tool_call_id=call["id"],
                                               tool=call["function"]["name"], arguments=entry.arguments))
        return pending

    def trace_entry(
        self, round_no: int, call: dict[str, Any], outcome: str, content: str, approval_id: str | None = None
    ) -> TraceEntry:
        return TraceEntry(round=round_no, tool_call_id=call["id"], name=call["function"]["name"],
                          arguments=self.shown_arguments(call), outcome=outcome, content=content,
                          approval_id=approval_id)

    def shown_arguments(self, call: dict[str, Any]) -> Any:
        """The call's arguments as a trace may show them: sensitive fields redacted."""
        raw = call["function"]["arguments"]
        tool = self._registry.get(call["function"]["name"])
        decoded = None
        # The model's text: nested too deep it is shown as sent (decoding it would recurse
        # until RecursionError); the executor refuses such arguments with INVALID_ARGUMENTS.
        if not nests_deeper_than(raw.encode("utf-8", "surrogatepass"), MAX_JSON_DEPTH_CEILING):
            try:
                decoded = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                decoded = None
        if isinstance(decoded, dict):
            return tool.redact(decoded) if tool is not None else decoded
        return REDACTED if tool is not None and tool.sensitive_fields else raw

    async def _stop_with_open_calls(self, run: LoopRun, code: ErrorCode, emit: Emit) -> LoopOutcome:
        closing = close_open_calls(run.history, code, f"Not run: {stop_text(code, run)}")
        await self._trace_unrun(run, closing, code, emit)
        return self._stopped(run, code)

    async def _trace_unrun(self, run: LoopRun, closing: list[Message], code: ErrorCode, emit: Emit) -> None:
        calls = {c["id"]: c for m in run.history if m.get("role") == "assistant" for c in m.get("tool_calls") or ()}
        for message in closing:
            entry = self.trace_entry(run.steps, calls[message["tool_call_id"]], code.value, message["content"])
            run.trace.append(entry)
            await emit(trace_event(entry))

    async def _hand_back(
        self,
        run: LoopRun,
        assistant: Message,
        client_calls: list[dict[str, Any]],
        own: list[ToolCallRequest],
        request_id: str | None,
    ) -> LoopOutcome:
        """Client tools (pass-through) are the client's to run: the turn goes back to it.

        The gateway's own calls of that answer are not run (the client could not append
        their results); the model asks again once it has the client's. Those of them the
        checks refuse (a broken call, an unknown tool, one the caller may not use) are
        still answered in the ledger and audited, as they would be without a client call
        beside them: a client call must not hide a model's attempts.
        """
        if own:
            refused = self._executor.refused(run.principal, own)
            if refused:
                await self._executor.execute(run.principal, run.run_id, refused, request_id=request_id)
            log.info("gateway_calls_deferred", run=run.run_id,
                     deferred=len(own) - len(refused), refused=len(refused))
            assistant["tool_calls"] = client_calls
        return LoopOutcome(state="completed", finish_reason="tool_calls", content=assistant["content"],
                           client_tool_calls=client_calls)

    def _stopped(self, run: LoopRun, code: ErrorCode) -> LoopOutcome:
        log.info("agent_run_stopped", run=run.run_id, stop_reason=code.value, steps=run.steps,
                 total_tokens=run.usage.total_tokens)
        return LoopOutcome(state="stopped", finish_reason="length", content=stop_text(code, run), stop_code=code)


def stop_text(code: ErrorCode, run: LoopRun) -> str:
    limits = run.limits
    if code is ErrorCode.MAX_STEPS_EXCEEDED:
        detail = f"this run reached its limit of {limits.max_steps} model rounds"
    elif code is ErrorCode.TOKEN_BUDGET_EXCEEDED:
        detail = f"this run used {run.usage.total_tokens} tokens of its budget of {limits.max_total_tokens}"
    else:
        detail = f"this run reached its time limit of {limits.timeout_s:g} s"
    return f"I stopped before finishing: {detail} ({code.value})."


def approval_text(run_id: str, pending: list[PendingApproval]) -> str:
    what = "; ".join(f"{p.tool} (approval {p.approval_id})" for p in pending)
    return (
        f"This needs an administrator's approval before I can go on: {what}. "
        f"Once it is decided, resume the run with POST /v1/runs/{run_id}/resume."
    )


def trace_event(entry: TraceEntry) -> dict[str, Any]:
    event = {"type": "tool_result", "round": entry.round, "tool_call_id": entry.tool_call_id, "name": entry.name,
             "outcome": entry.outcome, "content": entry.content}
    if entry.approval_id is not None:
        event["approval_id"] = entry.approval_id
    return event
