"""A scripted model provider: a real HTTP server that replays turns, in the OpenAI-compatible
(``/v1/chat/completions``) or Ollama-native (``/api/chat``) format, and records every request."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Body = dict[str, Any] | bytes


@dataclass
class Turn:
    """One answer: a JSON body (or raw bytes), a status and an optional delay before answering."""

    body: Body = field(default_factory=dict)
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


Step = Turn | Callable[[dict[str, Any]], Turn]

_ids = itertools.count(1)


def call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """A tool call as a model writes it (either format; the reply helpers convert)."""
    return {"id": call_id or f"call_{next(_ids)}", "name": name, "arguments": arguments}


def openai_turn(
    content: str | None = None,
    calls: list[dict[str, Any]] = (),  # type: ignore[assignment]
    *,
    prompt_tokens: int = 20,
    completion_tokens: int = 5,
    finish_reason: str | None = None,
    delay_s: float = 0.0,
) -> Turn:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"],
                          "arguments": c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"])}}
            for c in calls
        ]
    reason = finish_reason or ("tool_calls" if calls else "stop")
    return Turn(
        body={
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted-model",
            "choices": [{"index": 0, "message": message, "finish_reason": reason}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        },
        delay_s=delay_s,
    )


def ollama_turn(
    content: str = "",
    calls: list[dict[str, Any]] = (),  # type: ignore[assignment]
    *,
    prompt_tokens: int = 20,
    completion_tokens: int = 5,
    delay_s: float = 0.0,
) -> Turn:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"function": {"name": c["name"],
                          "arguments": c["arguments"] if isinstance(c["arguments"], dict) else json.loads(c["arguments"])}}
            for c in calls
        ]
    return Turn(
        body={"model": "scripted-model", "created_at": "2026-01-01T00:00:00Z", "message": message, "done": True,
              "done_reason": "stop", "prompt_eval_count": prompt_tokens, "eval_count": completion_tokens},
        delay_s=delay_s,
    )


class ScriptedModel:
    """An ASGI app. ``steps`` are answered in order; the last one repeats when they run out."""

    def __init__(self, steps: list[Step] | None = None) -> None:
        self.steps: list[Step] = list(steps or [])
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.url = ""
        self._served = 0

    def script(self, *steps: Step) -> None:
        self.steps = list(steps)
        self._served = 0

    @property
    def served(self) -> int:
        return self._served

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] not in ("/v1/chat/completions", "/api/chat"):
            await _respond(send, Turn(body={"error": "not found"}, status=404))
            return
        request = json.loads(body)
        self.requests.append(request)
        self.paths.append(scope["path"])
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        if not self.steps:
            await _respond(send, Turn(body={"error": "no script"}, status=500))
            return
        step = self.steps[min(self._served, len(self.steps) - 1)]
        self._served += 1
        turn = step(request) if callable(step) else step
        if turn.delay_s and await _client_left_within(receive, turn.delay_s):
            return
        await _respond(send, turn)


async def _client_left_within(receive: Any, seconds: float) -> bool:
    """Wait ``seconds``, or less if the client disconnects (then True)."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    waiter = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=seconds)
        return bool(done)
    finally:
        waiter.cancel()


async def _respond(send: Any, turn: Turn) -> None:
    payload = turn.body if isinstance(turn.body, bytes) else json.dumps(turn.body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in turn.headers.items()]
    await send({"type": "http.response.start", "status": turn.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
