"""Server-sent events in the OpenAI chunk format; the stream cleans up when the client goes away."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from tests.support.scripted_model import call, openai_turn
from tests.support.tokens import auth_for


async def test_the_stream_is_plain_data_lines_of_chunks_ending_in_done(gateway, model):
    model.script(openai_turn(calls=[call("add", {"a": 1, "b": 2})]), openai_turn("3"))
    lines = []
    async with gateway.http.stream(
        "POST", "/v1/chat/completions", headers=auth_for("alice"),
        json={"model": "default", "messages": [{"role": "user", "content": "1+2"}], "stream": True},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            lines.append(line)
    events = [line for line in lines if line]
    assert all(line.startswith("data: ") for line in events)  # no named events: clients would choke on them
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    progress = [c for c in chunks if not c["choices"]]
    assert all("gateway" in c for c in progress)
    assert [c["gateway"]["type"] for c in progress][:4] == ["round", "assistant", "tool_call", "tool_result"]
    assert "usage" not in chunks[-1]  # only with stream_options.include_usage
    finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finishing] == ["stop"]


async def test_a_client_that_goes_away_cancels_the_run_and_it_is_stored_as_cancelled(gateway, model):
    model.script(openai_turn(calls=[call("add", {"a": 1, "b": 2})]), openai_turn("3", delay_s=30))
    async with gateway.http.stream(
        "POST", "/v1/chat/completions", headers=auth_for("alice"),
        json={"model": "default", "messages": [{"role": "user", "content": "1+2"}], "stream": True},
    ) as response:
        run_id = None
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"tool_result"' in line:
                run_id = json.loads(line[len("data: "):])["gateway"]["run_id"]
                break
    assert run_id is not None
    for _ in range(200):
        run = await gateway.run(run_id)
        if run["state"] != "running":
            break
        await asyncio.sleep(0.05)
    assert run["state"] == "cancelled"
    assert [m["role"] for m in run["messages"]] == ["user", "assistant", "tool"]
    assert run["usage"]["model_calls"] == 1


@pytest.mark.parametrize("gateway_overrides", [{"stream_stall_timeout_s": 0.5}])
async def test_a_client_that_stops_reading_the_stream_is_cut_off_and_the_stream_ends(gateway, model):
    """A streamed chat whose client connects and never reads held its run and answer in
    memory for as long as the connection stayed open; after GATEWAY_STREAM_STALL_TIMEOUT_S
    the gateway ends it and closes the connection before the stream's end."""
    model.script(openai_turn("x" * 6_000_000))
    body = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nauthorization: {auth_for('alice')['Authorization']}\r\n\r\n"
    ).encode()
    host, port = gateway.url.removeprefix("http://").split(":")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    client.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(client, (host, int(port)))
        await asyncio.get_running_loop().sock_sendall(client, head + body)
        await asyncio.sleep(3)  # reading nothing, well past the deadline
        received = bytearray()
        while chunk := await asyncio.wait_for(asyncio.get_running_loop().sock_recv(client, 65536), 20):
            received += chunk
    finally:
        client.close()
    assert received.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" not in received and len(received) < 6_000_000
    # The gateway goes on serving.
    model.script(openai_turn("fine"))
    assert (await gateway.chat("again")).status_code == 200
