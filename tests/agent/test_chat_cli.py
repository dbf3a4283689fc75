"""`gateway chat "question"` prints each round, the tools and their results, the answer and the usage."""

from __future__ import annotations

import asyncio
import os
import sys

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
