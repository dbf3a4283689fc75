"""``gateway chat "question"``: run a conversation through a gateway and watch it round by round.

It streams ``POST /v1/chat/completions`` and prints each round, the tools called with
their arguments, what each returned, the final answer and the token usage.

A run that stops for an approval prints each approval's id and how to decide it (the
console, or ``gateway approvals approve``), then waits: it reads the approvals
(``GET /v1/approvals/{id}``, as the requester may) every second, for at most ``--wait``
seconds, and once all are decided resumes the run (``POST /v1/runs/{id}/resume``) and
prints the rest. ``--wait 0`` returns at once; ``--resume RUN`` goes on with a run later.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import httpx
import msgspec

RESULT_PREVIEW = 300
DEFAULT_WAIT_S = 300.0
POLL_INTERVAL_S = 1.0
UNDECIDED = ("pending", "executing")
DEMO_MODEL = "demo-scripted"  # gateway.llm.demo_model.DEMO_MODEL, not imported: this command starts fast


def add_parser(commands: Any) -> None:
    chat = commands.add_parser("chat", help="ask a question through the agent loop and watch each round")
    chat.add_argument("question", nargs="*", help="what to ask (none with --resume)")
    chat.add_argument("--url", default=None, help="the gateway's base URL (default $GATEWAY_URL or http://127.0.0.1:8000)")
    chat.add_argument("--token", default=None, help="a bearer token (default $GATEWAY_TOKEN, else one is minted)")
    chat.add_argument("--tenant", default="acme", help="tenant of a minted token (default acme)")
    chat.add_argument("--user", default=None,
                      help="user of a minted token (default alice; with --demo bob, the demo editor, whose "
                           "writes wait for an approval)")
    chat.add_argument("--role", action="append", dest="roles", metavar="ROLE", help="roles of a minted token")
    chat.add_argument("--demo", action="store_true", help="mint the token with the demo secret")
    chat.add_argument("--model", default="default", help="the model provider to use (default: the default one)")
    chat.add_argument("--system", default=None, help="a system prompt")
    chat.add_argument("--max-steps", type=int, default=None, help="lower the run's max_steps")
    chat.add_argument("--max-total-tokens", type=int, default=None, help="lower the run's max_total_tokens")
    chat.add_argument("--timeout", type=float, default=None, help="lower the run's timeout (seconds)")
    chat.add_argument("--wait", type=float, default=DEFAULT_WAIT_S, metavar="SECONDS",
                      help=f"when the run waits for an approval, wait this long for the decision, then resume "
                           f"(default {DEFAULT_WAIT_S:g}; 0: return at once)")
    chat.add_argument("--resume", metavar="RUN", default=None,
                      help="go on with a run that waited for an approval (waiting again as --wait says)")


_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class TerminalText:
    """A text stream that writes what models, tools and services said fit for a terminal:
    every control character but the line break and the tab is written escaped (``\\x1b``),
    so an answer cannot move the cursor, retitle the window or forge a line of its own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(_UNPRINTABLE.sub(_escaped, text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


def _escaped(match: re.Match[str]) -> str:
    return match[0].encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class ApprovalHints:
    """What the command prints so that someone can decide a pending approval."""

    console_url: str
    tenant: str = "TENANT"
    approver: str = "APPROVER"


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


def run_chat(
    url: str,
    token: str,
    body: dict[str, Any] | None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    *,
    resume_run: str | None = None,
    wait_s: float = 0.0,
    hints: ApprovalHints | None = None,
) -> int:
    """Run ``body`` (or resume ``resume_run``), printing every round; follow approvals as
    ``wait_s`` says. 0 when the run ended (answered, or stopped by a limit), 1 when it failed
    or is still waiting for an approval."""
    out, err = TerminalText(out), TerminalText(err)
    base = url.rstrip("/")
    hints = hints or ApprovalHints(console_url=f"{base}/console/")
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx.Timeout(connect=10.0, read=600.0, write=30.0, pool=10.0)
    resume_body = {"stream": True, "stream_options": {"include_usage": True}}
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            if body is not None:
                print(f"you: {body['messages'][-1]['content']}", file=out, flush=True)
                summary = _stream(client, base + "/v1/chat/completions", body, headers, out, err)
            else:
                print(f"resuming run {resume_run}", file=out, flush=True)
                summary = _stream(client, f"{base}/v1/runs/{resume_run}/resume", resume_body, headers, out, err)
            while summary is not None:
                stop = summary.get("stop_reason") or {}
                if stop.get("code") != "APPROVAL_REQUIRED":
                    return 0
                run_id = str(summary.get("run_id", "?"))
                approval_ids = [str(i) for i in stop.get("approval_ids") or ()]
                _explain(out, run_id, approval_ids, stop.get("pending") or [], hints, wait_s)
                if wait_s <= 0:
                    return 0
                if not _wait_for_decisions(client, base, headers, approval_ids, wait_s, out, err):
                    print(f"gateway: still waiting for an approval after {wait_s:g} s; go on later with "
                          f"`gateway chat --resume {run_id}`", file=err)
                    return 1
                print(f"--- resuming run {run_id} ---", file=out, flush=True)
                summary = _stream(client, f"{base}/v1/runs/{run_id}/resume", resume_body, headers, out, err)
    except httpx.HTTPError as exc:
        print(f"gateway: cannot reach {url}: {type(exc).__name__}", file=err)
        return 1
    except (AttributeError, KeyError, TypeError, IndexError, RecursionError):
        # JSON, but not shaped as the gateway's answers are (an event, a summary, an approval;
        # nested deeper than the decoder recurses): whatever answered is not this gateway, or
        # not this version of it.
        print(f"gateway: the answer from {url} is not shaped as this command expects", file=err)
        return 1
    return 1


def _stream(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str], out: TextIO, err: TextIO
) -> dict[str, Any] | None:
    """One streamed answer, printed as it comes; its ``gateway`` summary, or None when it failed."""
    printer = _Printer(out)
    with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            print(f"gateway: {response.status_code} {_error_text(response.content)}", file=err)
            return None
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            try:
                event = msgspec.json.decode(data)
            except msgspec.DecodeError:
                event = None
            if not isinstance(event, dict):
                print("gateway: the answer's stream held an event that is not a JSON object", file=err)
                return None
            if "error" in event:
                print(f"gateway: {_describe(event['error'])}", file=err)
                return None
            printer.chunk(event)
    printer.finish()
    return printer.summary or {}


def _explain(
    out: TextIO, run_id: str, approval_ids: list[str], pending: list[Any], hints: ApprovalHints, wait_s: float
) -> None:
    tools = {str(p.get("approval_id")): str(p.get("tool")) for p in pending if isinstance(p, dict)}
    for approval_id in approval_ids:
        tool = f" ({tools[approval_id]})" if approval_id in tools else ""
        print(f"waiting for approval {approval_id}{tool}: an approver decides it", file=out)
        print(f"  in the console: {hints.console_url}", file=out)
        print(f"  or in a terminal: gateway approvals approve {approval_id} --tenant {hints.tenant} "
              f"--as {hints.approver}", file=out)
    if wait_s > 0:
        print(f"waiting up to {wait_s:g} s for the decision (then the run goes on; "
              f"later: `gateway chat --resume {run_id}`)", file=out, flush=True)
    else:
        print(f"once decided, go on with: gateway chat --resume {run_id}", file=out, flush=True)


def _wait_for_decisions(
    client: httpx.Client, base: str, headers: dict[str, str], approval_ids: list[str], wait_s: float,
    out: TextIO, err: TextIO,
) -> bool:
    """Whether every approval was decided within ``wait_s`` (each read as its requester may)."""
    deadline = time.monotonic() + wait_s
    waiting = list(approval_ids)
    while True:
        for approval_id in list(waiting):
            response = client.get(f"{base}/v1/approvals/{approval_id}", headers=headers, timeout=10.0)
            if response.status_code != 200:
                print(f"gateway: {response.status_code} {_error_text(response.content)}", file=err)
                return False
            try:
                view = msgspec.json.decode(response.content)
            except msgspec.DecodeError:
                print("gateway: the approval could not be read (not JSON)", file=err)
                return False
            status = view.get("status") if isinstance(view, dict) else None
            if status not in UNDECIDED:
                decided_by = f" by {view.get('decided_by')}" if view.get("decided_by") else ""
                print(f"approval {approval_id}: {status}{decided_by}", file=out, flush=True)
                waiting.remove(approval_id)
        if not waiting:
            return True
        if time.monotonic() + POLL_INTERVAL_S > deadline:
            return False
        time.sleep(POLL_INTERVAL_S)


class _Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.answer: list[str] = []
        self.finish_reason: str | None = None
        self.summary: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.labelled = False

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def chunk(self, event: dict[str, Any]) -> None:
        if event.get("model") == DEMO_MODEL and not self.labelled:
            self.labelled = True
            self.say("(answered by the gateway's scripted demo model: keyword rules, not a language model)")
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

    def finish(self) -> None:
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


def _error_text(body: bytes) -> str:
    try:
        return _describe(msgspec.json.decode(body)["error"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return "(no error body)"


def _describe(error: dict[str, Any]) -> str:
    request_id = f" (request {error['request_id']})" if error.get("request_id") else ""
    return f"{error.get('code')}: {error.get('message')}{request_id}"
