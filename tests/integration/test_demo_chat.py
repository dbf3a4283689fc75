"""The demo as a new user tries it: `gateway serve --demo` without a model server, then
`gateway chat --demo "add 2 and 3, then create an article"`: a tool round, an approval pause,
the approval decided by the second approver with `gateway approvals approve`, the resumed answer."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support import db
from tests.support.processes import ROOT, gateway_env, start_gateway, wait_until_ready

QUESTION = "add 2 and 3, then create an article"


def demo_env(database_url: str) -> dict[str, str]:
    """The environment of someone trying the demo: no secret of their own, no model configured."""
    env = gateway_env(database_url, log_level="WARNING")
    del env["GATEWAY_JWT_SECRET"]
    return env


async def read_until(stream: asyncio.StreamReader, pattern: str, seen: list[str], timeout: float = 60) -> re.Match[str]:
    async def scan() -> re.Match[str]:
        while True:
            line = (await stream.readline()).decode()
            assert line, "chat ended early:\n" + "".join(seen)
            seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    return await asyncio.wait_for(scan(), timeout)


async def test_the_demo_chat_pauses_for_an_approval_the_second_approver_decides_and_then_answers(pg_url, tmp_path: Path):
    env = demo_env(pg_url)
    server = start_gateway(env, tmp_path / "serve.log", "--demo", cwd=tmp_path)
    try:
        wait_until_ready(server)
        banner = (tmp_path / "serve.log").read_text()
        assert re.search(r"acme/dave \(approver\):\n\s+eyJ", banner)
        assert f"{server.url}/console/" in banner and "scripted demo model `demo-scripted`" in banner
        models = httpx.get(server.url + "/v1/models", timeout=5,
                           headers={"Authorization": "Bearer " + re.search(r"acme/dave \(approver\):\n\s+(\S+)",
                                                                         banner).group(1)})
        assert [m["id"] for m in models.json()["data"]] == ["demo-scripted"]

        chat = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "chat", "--demo", "--url", server.url, "--wait", "60", QUESTION,
            cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            seen: list[str] = []
            approval_id = (await read_until(chat.stdout, r"waiting for approval (apr_\w+) \(create_article\)", seen))[1]
            await read_until(chat.stdout, r"^waiting up to 60 s", seen)
            pending = await db.approvals(pg_url, id=approval_id)
            assert pending[0].status == "pending" and pending[0].requester_id == "bob"
            decided = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "gateway", "approvals", "approve", approval_id,
                                 "--tenant", "acme", "--as", "dave"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
            )
            assert decided.returncode == 0, decided.stderr
            out, err = await asyncio.wait_for(chat.communicate(), timeout=60)
        finally:
            if chat.returncode is None:
                chat.kill()
                await chat.wait()
        assert chat.returncode == 0, err.decode()
        text = "".join(seen) + out.decode()
        print("CHATOUT\n" + text + "\nBANNER\n" + banner)
        lines = text.splitlines()
        assert lines[0] == f"you: {QUESTION}"
        assert "(answered by the gateway's scripted demo model: keyword rules, not a language model)" in lines
        # The tool round, then the pause with what to do about it.
        assert '  -> add({"a":2,"b":3})' in lines and '  <- add [OK] {"ok":true,"result":5}' in lines
        assert any(line.startswith("  <- create_article [APPROVAL_REQUIRED]") for line in lines)
        assert f"stopped: APPROVAL_REQUIRED (approvals: {approval_id})" in lines
        assert f"  in the console: {server.url}/console/" in lines
        assert f"  or in a terminal: gateway approvals approve {approval_id} --tenant acme --as dave" in lines
        # The decision, and the resumed run's answer.
        assert f"approval {approval_id}: succeeded by dave" in lines
        resumed = lines[lines.index(next(line for line in lines if line.startswith("--- resuming run"))):]
        assert any(line.startswith("  <- create_article [OK]") for line in resumed)
        (answer,) = [line for line in resumed if line.startswith("assistant: ")]
        assert re.fullmatch(r'assistant: \[demo model\] add returned 5; create_article returned art_\w+ '
                            r'"A note from the demo model"\.', answer), answer
        assert "stopped:" not in "\n".join(resumed)
        (article,) = await db.articles(pg_url, tenant_id="acme", author_id="bob", title="A note from the demo model")
        assert article is not None
    finally:
        server.stop()


def test_outside_demo_mode_the_scripted_model_stops_start_up_with_a_clear_message(pg_url, tmp_path: Path):
    providers = '[{"name": "scripted", "kind": "demo", "base_url": "http://127.0.0.1:9/v1", "model": "x"}]'
    for setting in ({"llm_kind": "demo"}, {"llm_providers": providers}):
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--port", "1"],
            cwd=tmp_path, env=gateway_env(pg_url, **setting), capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "scripted demo model" in done.stderr and "only in demo mode" in done.stderr
        assert "Traceback" not in done.stderr


def test_gateway_chat_refuses_a_malformed_run_to_resume(tmp_path: Path):
    for args in (["--resume", "../../v1/admin/x"], ["--resume", "run_1\n"], ["--resume", "run_1", "also a question"], []):
        done = subprocess.run([sys.executable, "-m", "gateway", "chat", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                          if not k.startswith("GATEWAY_")})
        assert done.returncode == 2 and "--resume" in done.stderr, args


async def test_a_chat_that_stops_waiting_goes_on_later_with_resume(pg_url, tmp_path: Path):
    env = demo_env(pg_url)
    server = start_gateway(env, tmp_path / "serve.log", "--demo", cwd=tmp_path)

    def chat(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", "chat", "--demo", "--url", server.url, *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    try:
        wait_until_ready(server)
        gave_up = await asyncio.to_thread(chat, "--wait", "1", "create an article")
        assert gave_up.returncode == 1
        run_id = re.search(r"gateway chat --resume (run_\w+)", gave_up.stderr)[1]
        approval_id = re.search(r"waiting for approval (apr_\w+)", gave_up.stdout)[1]
        at_once = await asyncio.to_thread(chat, "--wait", "0", "--resume", run_id)
        assert at_once.returncode == 0, at_once.stderr
        assert f"once decided, go on with: gateway chat --resume {run_id}" in at_once.stdout
        decided = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "gateway", "approvals", "reject", approval_id, "--reason",
                             "not today", "--tenant", "acme", "--as", "dave"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )
        assert decided.returncode == 0, decided.stderr
        resumed = await asyncio.to_thread(chat, "--resume", run_id)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.startswith(f"resuming run {run_id}\n")
        assert "  <- create_article [APPROVAL_REJECTED]" in resumed.stdout
        assert "assistant: [demo model] create_article did not succeed (APPROVAL_REJECTED)." in resumed.stdout
        assert await db.articles(pg_url, tenant_id="acme", title="A note from the demo model") == []
    finally:
        server.stop()
