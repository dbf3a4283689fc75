"""``gateway chat "question"``: run a conversation through a gateway and watch it round by round.

It streams ``POST /v1/chat/completions`` and prints each round, the tools called with
their arguments, what each returned, the final answer and the token usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import httpx
import msgspec

RESULT_PREVIEW = 300


def add_parser(commands: Any) -> None:
    chat = commands.add_parser("chat", help="ask a question through the agent loop and watch each round")
    chat.add_argument("question", nargs="+", help="what to ask")
    chat.add_argument("--url", default=None, help="the gateway's base URL (default $GATEWAY_URL or http://127.0.0.1:8000)")
    chat.add_argument("--token", default=None, help="a bearer token (default $GATEWAY_TOKEN, else one is minted)")
    chat.add_argument("--tenant", default="acme", help="tenant of a minted token (default acme)")
    chat.add_argument("--user", default="alice", help="user of a minted token (default alice)")
    chat.add_argument("--role", action="append", dest="roles", metavar="ROLE", help="roles of a minted token")
    chat.add_argument("--demo", action="store_true", help="mint the token with the demo secret")
    chat.add_argument("--model", default="default", help="the model provider to use (default: the default one)")
    chat.add_argument("--system", default=None, help="a system prompt")
    chat.add_argument("--max-steps", type=int, default=None, help="lower the run's max_steps")
    chat.add_argument("--max-total-tokens", type=int, default=None, help="lower the run's max_total_tokens")
    chat.add_argument("--timeout", type=float, default=None, help="lower the run's timeout (seconds)")


def request_body(args: argparse.Namespace) -> dict[str, Any]:
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": " ".join(args.question)})
    limits = {k: v for k, v in (("max_steps", args.max_steps), ("max_total_tokens", args.max_total_tokens),
                                ("timeout_s", args.timeout)) if v is not None}
    body: dict[str, Any] = {"model": args.model, "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}}
    if limits:
        body["gateway"] = limits
    return body


def run_chat(url: str, token: str, body: dict[str, Any], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    print(f"you: {body['messages'][-1]['content']}", file=out, flush=True)
    printer = _Printer(out)
    timeout = httpx.Timeout(connect=10.0, read=600.0, write=30.0, pool=10.0)
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            with client.stream("POST", url.rstrip("/") + "/v1/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {token}"}) as response:
                if response.status_code != 200:
                    response.read()
                    print(f"gateway: {response.status_code} {_error_text(response.content)}", file=err)
                    return 1
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        break
                    event = msgspec.json.decode(data)
                    if "error" in event:
                        print(f"gateway: {_describe(event['error'])}", file=err)
                        return 1
                    printer.chunk(event)
    except httpx.HTTPError as exc:
        print(f"gateway: cannot reach {url}: {type(exc).__name__}", file=err)
        return 1
    return printer.finish()


class _Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.answer: list[str] = []
        self.finish_reason: str | None = None
        self.summary: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def chunk(self, event: dict[str, Any]) -> None:
        gateway = event.get("gateway")
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.answer.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                self.say(f"  -> (for you) {call['function']['name']}({call['function']['arguments']})")
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if not gateway:
            return
        kind = gateway.get("type")
        if kind == "round":
            dropped = gateway.get("messages_dropped") or 0
            note = f"  ({dropped} old messages left out to fit the context window)" if dropped else ""
            self.say(f"--- round {gateway['round']} ---{note}")
        elif kind == "assistant" and gateway.get("content"):
            self.say(f"  model: {gateway['content']}")
        elif kind == "tool_call":
            arguments = msgspec.json.encode(gateway.get("arguments")).decode()
            self.say(f"  -> {gateway['name']}({arguments})")
        elif kind == "tool_result":
            content = str(gateway.get("content", ""))
            if len(content) > RESULT_PREVIEW:
                content = content[:RESULT_PREVIEW] + "..."
            self.say(f"  <- {gateway['name']} [{gateway['outcome']}] {content}")
        elif kind == "done":
            self.summary = gateway

    def finish(self) -> int:
        self.say(f"assistant: {''.join(self.answer)}")
        summary = self.summary or {}
        stop = summary.get("stop_reason")
        if stop:
            extra = f" (approvals: {', '.join(stop['approval_ids'])})" if stop.get("approval_ids") else ""
            self.say(f"stopped: {stop['code']}{extra}")
        usage = self.usage or {}
        self.say(
            f"tokens: prompt={usage.get('prompt_tokens', 0)} completion={usage.get('completion_tokens', 0)} "
            f"total={usage.get('total_tokens', 0)} over {summary.get('steps', 0)} model call(s); "
            f"run {summary.get('run_id', '?')}"
        )
        return 0


def _error_text(body: bytes) -> str:
    try:
        return _describe(msgspec.json.decode(body)["error"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return "(no error body)"


def _describe(error: dict[str, Any]) -> str:
    request_id = f" (request {error['request_id']})" if error.get("request_id") else ""
    return f"{error.get('code')}: {error.get('message')}{request_id}"
