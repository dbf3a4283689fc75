"""An approval outlives the process that created it: the gateway that executes it may have other
tools. The frozen call is checked again against what is deployed when it is approved."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.tools.base import ToolContext, struct_tool
from gateway.tools.builtin import Strict, builtin_tools
from gateway.tools.registry import ToolRegistry
from tests.support.app import make_settings
from tests.support.approvals import approve, request_approval
from tests.support.calls import create_run, outcome, send_one
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")


class StricterNote(Strict):
    text: Annotated[str, msgspec.Meta(max_length=3)] = ""


@struct_tool(name="write_note", description="Now stricter.", arguments=StricterNote, permission="articles:write",
             mutates=True)
async def stricter_write_note(ctx: ToolContext, args: StricterNote) -> object:
    return {"written": args.text}


async def approve_elsewhere(database_url: str, registry: ToolRegistry, approval_id: str) -> dict:
    async with AsyncTestClient(app=create_app(make_settings(database_url), registry=registry)) as other:
        response = await approve(other, approval_id)
        assert response.status_code == 200, response.text
        return response.json()


async def test_a_tool_no_longer_deployed_is_tool_not_found_when_approved(client, database_url):
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "c1", "write_note", {"text": "hello"})
    view = await approve_elsewhere(database_url, ToolRegistry(builtin_tools()), approval_id)
    assert (view["status"], view["outcome"]["code"]) == ("failed", "TOOL_NOT_FOUND")
    assert outcome(await send_one(client, run["id"], BOB, "c1", "write_note", {"text": "hello"})) == "TOOL_NOT_FOUND"


async def test_arguments_the_deployed_tool_no_longer_accepts_are_invalid_arguments(client, database_url):
    run = await create_run(client, BOB)
    approval_id = await request_approval(client, run["id"], BOB, "c1", "write_note", {"text": "far too long"})
    view = await approve_elsewhere(database_url, ToolRegistry([*builtin_tools(), stricter_write_note]), approval_id)
    assert (view["status"], view["outcome"]["code"]) == ("failed", "INVALID_ARGUMENTS")
