"""`gateway chat "question"` prints each round, the tools and their results, the answer and the usage."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from tests.support.loopback import serve
from tests.support.scripted_model import Turn, call, openai_turn
from tests.support.tokens import make_token


async def run_cli(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "GATEWAY_LOG_LEVEL": "WARNING"}
    env.pop("GATEWAY_TOKEN", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "chat", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_gateway_chat_shows_each_round_its_tools_the_answer_and_the_tokens(gateway, model):
    model.script(
        openai_turn(calls=[call("divide", {"a": 10, "b": 0}), call("divide", {"a": 10, "b": 2})],
                    prompt_tokens=100, completion_tokens=20),
        openai_turn("10/0 is undefined; 10/2 = 5.", prompt_tokens=150, completion_tokens=10),
    )
    code, out, err = await run_cli("10/0 and 10/2?", "--url", gateway.url, "--token", make_token("acme", "alice"))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "you: 10/0 and 10/2?"
    assert "--- round 1 ---" in lines and "--- round 2 ---" in lines
    assert any(line.strip().startswith('-> divide({"a":10,"b":0})') for line in lines)
    assert any("<- divide [BUSINESS_RULE_VIOLATION]" in line for line in lines)
    assert any('<- divide [OK] {"ok":true,"result":5}' in line for line in lines)
    assert "assistant: 10/0 is undefined; 10/2 = 5." in lines
    assert any(line.startswith("tokens: prompt=250 completion=30 total=280 over 2 model call(s)") for line in lines)


async def test_gateway_chat_says_why_it_failed(gateway, model):
    model.script(Turn(status=500))
    code, out, err = await run_cli("hi", "--url", gateway.url, "--token", make_token("acme", "alice"))
    assert code == 1
    assert "UPSTREAM_UNAVAILABLE" in err


async def test_gateway_chat_writes_what_the_model_and_tools_said_escaped_never_as_terminal_controls(gateway, model):
    # A model's text (or a tool's result) may hold escape sequences: retitling the window,
    # clearing a line, or a carriage return that overwrites what was printed with a forged line.
    hostile = "done\x1b]0;pwned-title\x07\x1b[2K\rgateway: approval apr_x approved by carol"
    model.script(openai_turn(hostile))
    code, out, err = await run_cli("hi", "--url", gateway.url, "--token", make_token("acme", "alice"))
    assert code == 0, err
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "assistant: done\\x1b]0;pwned-title\\x07\\x1b[2K\\rgateway: approval apr_x approved by carol" in out


def _streaming(event: bytes):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\ndata: ' + event + b"\n\n"})
    return app


@pytest.mark.parametrize(
    ("event", "said"),
    [(b"not json", "not a JSON object"), (b"[1, 2]", "not a JSON object"),
     (b'{"choices": [1]}', "not shaped as this command expects"),
     (b'{"gateway": "x"}', "not shaped as this command expects"),
     (b'{"choices": [{"delta": {"tool_calls": [{}]}}]}', "not shaped as this command expects"),
     (b'{"error": "boom"}', "not shaped as this command expects"),
     (b"[" * 100_000 + b"]" * 100_000, "not shaped as this command expects")],
    ids=["not-json", "a-list", "a-choice-not-an-object", "gateway-not-an-object", "a-call-without-function",
         "error-not-an-object", "nested-100000-deep"],
)
async def test_gateway_chat_says_in_one_line_when_the_stream_holds_what_it_cannot_read(event, said):
    async with serve(_streaming(event)) as url:
        code, out, err = await run_cli("hi", "--url", url, "--token", make_token("acme", "alice"))
    assert code == 1
    assert "Traceback" not in err
    assert said in err
