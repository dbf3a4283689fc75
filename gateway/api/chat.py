"""The agent loop over HTTP: an OpenAI-compatible chat completions endpoint, and resume.

``POST /v1/chat/completions`` runs the conversation through the loop and answers with the
final assistant message; the official ``openai`` client works unchanged with ``base_url``
at the gateway's ``/v1`` and the caller's JWT as ``api_key``. ``stream=true`` answers with
server-sent events in the OpenAI chunk format; progress (rounds, tool calls, their
results) travels as chunks with ``choices: []`` and a ``gateway`` object, which official
clients parse without error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import structlog
from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.agent.loop import LoopOutcome, LoopRun, TraceEntry, trace_event
from gateway.agent.service import AgentService, ChatRequest
from gateway.api.chat_schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessageIn,
    Choice,
    CompletionMessage,
    CompletionUsage,
    FunctionCallOut,
    GatewayExtension,
    LoopLimitsView,
    ModelCard,
    ModelList,
    PendingApprovalView,
    ResumeRequest,
    StopReason,
    ToolCallOut,
    TraceItem,
)
from gateway.api.params import ResourceId
from gateway.api.context import request_id_of
from gateway.api.dependencies import principal_of
from gateway.api.stalled_streams import StallLimitedStream
from gateway.api.openapi import error_responses
from gateway.api.schemas import ErrorBody
from gateway.errors import ERRORS, ErrorCode, GatewayError, new_error_id
from gateway.llm.base import Message, SamplingOptions

log = structlog.get_logger("gateway.http")

_encoder = msgspec.json.Encoder()


class ChatController(Controller):
    path = "/v1"
    tags = ["agent loop"]

    @post(
        "/chat/completions",
        status_code=200,
        summary="Run a conversation through the agent loop (OpenAI-compatible)",
        responses=error_responses(400, 401, 403, 413, 502, 503, 504),
    )
    async def chat_completions(
        self, request: Request, agent: NamedDependency[AgentService], data: JSONBody[ChatCompletionRequest]
    ) -> Response[ChatCompletion]:
        """The gateway supplies the tools and runs every call through its guards; the answer is the final
        assistant message with `usage` summed over the run's model calls and a `gateway` object (run id, trace,
        stop reason). A limit or a pending approval still answers 200."""
        principal = principal_of(request)
        run = await agent.start(principal, chat_request(data))
        return await _answer(agent, request, run, None, stream=data.stream, options=data.stream_options)

    @post(
        "/runs/{run_id:str}/resume",
        status_code=200,
        summary="Resume an agent run after its approvals were decided",
        responses=error_responses(400, 401, 404, 409, 502, 503, 504),
    )
    async def resume_run(
        self,
        request: Request,
        agent: NamedDependency[AgentService],
        run_id: ResourceId,
        data: JSONBody[ResumeRequest | None] = None,
    ) -> Response[ChatCompletion]:
        """The decided calls are answered from their stored outcome in place of `APPROVAL_REQUIRED` and the loop
        goes on; while an approval is still pending, the answer says so again."""
        body = data or ResumeRequest()
        run, waiting = await agent.resume(principal_of(request), run_id, request_id=request_id_of(request.scope))
        return await _answer(agent, request, run, waiting, stream=body.stream, options=body.stream_options)

    @get("/models", summary="The model providers a request may name in `model`", responses=error_responses(401))
    async def list_models(self, agent: NamedDependency[AgentService]) -> ModelList:
        return ModelList(data=[ModelCard(id=name, created=0, owned_by="gateway") for name in agent.provider_names])


async def _answer(
    agent: AgentService,
    request: Request[Any, Any, Any],
    run: LoopRun,
    outcome: LoopOutcome | None,
    *,
    stream: bool,
    options: Any,
) -> Response[Any]:
    request_id = request_id_of(request.scope)
    created = int(time.time())
    if stream:
        include_usage = bool(options and options.include_usage)
        return StallLimitedStream(
            _events(agent, run, outcome, request_id=request_id, created=created, include_usage=include_usage),
            stall_timeout_s=agent.stream_stall_timeout_s,
            log_fields={"stream": "chat", "run": run.run_id},
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    if outcome is None:
        outcome = await agent.drive(run, request_id=request_id)
    return Response(content=completion(run, outcome, created=created))


def chat_request(data: ChatCompletionRequest) -> ChatRequest:
    if data.logprobs:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "logprobs is not supported by the gateway.")
    messages = [_message(m, index) for index, m in enumerate(data.messages)]
    stop = [data.stop] if isinstance(data.stop, str) else data.stop
    client_tools = [msgspec.to_builtins(tool) for tool in data.tools or ()]
    options = SamplingOptions(
        temperature=data.temperature,
        top_p=data.top_p,
        max_tokens=data.max_completion_tokens or data.max_tokens,
        stop=stop,
        seed=data.seed,
        presence_penalty=data.presence_penalty,
        frequency_penalty=data.frequency_penalty,
        tool_choice=data.tool_choice,
    )
    extra = data.gateway
    return ChatRequest(
        messages=messages,
        model=data.model,
        client_tools=client_tools,
        options=options,
        max_steps=extra.max_steps if extra else None,
        max_total_tokens=extra.max_total_tokens if extra else None,
        timeout_s=extra.timeout_s if extra else None,
        max_tool_calls=extra.max_tool_calls if extra else None,
        max_repeats=extra.max_repeats if extra else None,
    )


def _message(message: ChatMessageIn, index: int) -> Message:
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.type != "text" or part.text is None:
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST, f"messages[{index}]: only text content parts are supported."
                )
            texts.append(part.text)
        content = "".join(texts)
    out: Message = {"role": "system" if message.role == "developer" else message.role, "content": content or ""}
    if message.name:
        out["name"] = message.name
    if message.role == "assistant" and message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    if message.role == "tool":
        if not message.tool_call_id:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"messages[{index}]: a tool message needs tool_call_id.")
        out["tool_call_id"] = message.tool_call_id
    return out


# -- the answer -----------------------------------------------------------------------------


def completion(run: LoopRun, outcome: LoopOutcome, *, created: int) -> ChatCompletion:
    return ChatCompletion(
        id=completion_id(run),
        created=created,
        model=run.model.model,
        choices=[Choice(index=0, message=_completion_message(outcome), finish_reason=outcome.finish_reason)],
        usage=_usage(run),
        gateway=extension(run, outcome),
    )


def completion_id(run: LoopRun) -> str:
    return "chatcmpl-" + run.run_id


def _completion_message(outcome: LoopOutcome) -> CompletionMessage:
    return CompletionMessage(role="assistant", content=outcome.content, tool_calls=_tool_calls(outcome) or None)


def _tool_calls(outcome: LoopOutcome) -> list[ToolCallOut]:
    return [
        ToolCallOut(id=c["id"], type="function",
                    function=FunctionCallOut(name=c["function"]["name"], arguments=c["function"]["arguments"]))
        for c in outcome.client_tool_calls
    ]


def _usage(run: LoopRun) -> CompletionUsage:
    return CompletionUsage(prompt_tokens=run.usage.prompt_tokens, completion_tokens=run.usage.completion_tokens,
                           total_tokens=run.usage.total_tokens)


def extension(run: LoopRun, outcome: LoopOutcome) -> GatewayExtension:
    stop_reason = None
    if outcome.stop_code is not None:
        pending = [PendingApprovalView(approval_id=p.approval_id, tool_call_id=p.tool_call_id, tool=p.tool,
                                       arguments=p.arguments) for p in outcome.pending]
        stop_reason = StopReason(
            code=outcome.stop_code.value,
            message=outcome.content,
            approval_ids=[p.approval_id for p in outcome.pending] or None,
            pending=pending or None,
        )
    return GatewayExtension(
        run_id=run.run_id,
        provider=run.model.name,
        state=outcome.state,
        stop_reason=stop_reason,
        steps=run.steps,
        messages_dropped=run.messages_dropped,
        limits=LoopLimitsView(max_steps=run.limits.max_steps, max_total_tokens=run.limits.max_total_tokens,
                              timeout_s=run.limits.timeout_s),
        trace=[_trace_item(entry) for entry in run.trace],
    )


def _trace_item(entry: TraceEntry) -> TraceItem:
    return TraceItem(round=entry.round, tool_call_id=entry.tool_call_id, name=entry.name, arguments=entry.arguments,
                     outcome=entry.outcome, content=entry.content, approval_id=entry.approval_id)


# -- streaming ------------------------------------------------------------------------------


def _sse(payload: Any) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


async def _events(
    agent: AgentService,
    run: LoopRun,
    outcome: LoopOutcome | None,
    *,
    request_id: str | None,
    created: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """The loop runs in its own task and reports here through a queue. Nothing here holds a
    database connection: the loop opens and closes its own. If the client goes away, the
    loop is cancelled and stores the run as ``cancelled``."""
    base = {"id": completion_id(run), "object": "chat.completion.chunk", "created": created, "model": run.model.model}
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def emit(event: dict[str, Any]) -> None:
        queue.put_nowait(("progress", event))

    async def drive() -> None:
        try:
            queue.put_nowait(("done", outcome or await agent.drive(run, request_id=request_id, emit=emit)))
        except GatewayError as exc:
            queue.put_nowait(("error", ErrorBody(code=exc.code.value, message=exc.message, request_id=request_id)))
        except Exception:
            error_id = new_error_id()
            log.exception("agent_stream_failed", run=run.run_id, error_id=error_id)
            queue.put_nowait(("error", ErrorBody(code=ErrorCode.INTERNAL_ERROR.value,
                                                 message=ERRORS[ErrorCode.INTERNAL_ERROR].message,
                                                 request_id=request_id, error_id=error_id)))

    task = asyncio.create_task(drive())
    try:
        yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})
        for entry in run.trace:  # calls answered before the loop started (a resume)
            yield _sse({**base, "choices": [], "gateway": trace_event(entry)})
        while True:
            kind, value = await queue.get()
            if kind == "progress":
                yield _sse({**base, "choices": [], "gateway": {**value, "run_id": run.run_id}})
                continue
            if kind == "error":
                yield _sse({"error": msgspec.to_builtins(value)})
                return
            for chunk in _final_chunks(base, run, value, include_usage):
                yield chunk
            return
    finally:
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task}, timeout=10)


def _final_chunks(base: dict[str, Any], run: LoopRun, outcome: LoopOutcome, include_usage: bool) -> list[bytes]:
    delta: dict[str, Any] = {"content": outcome.content}
    calls = _tool_calls(outcome)
    if calls:
        delta["tool_calls"] = [{"index": i, **msgspec.to_builtins(call)} for i, call in enumerate(calls)]
    chunks = [
        _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": outcome.finish_reason}]}),
    ]
    summary: dict[str, Any] = {**base, "choices": [],
                               "gateway": {"type": "done", **msgspec.to_builtins(extension(run, outcome))}}
    if include_usage:
        summary["usage"] = msgspec.to_builtins(_usage(run))
    chunks.append(_sse(summary))
    chunks.append(b"data: [DONE]\n\n")
    return chunks
