"""An upstream tool's structured answer is checked against its listed output schema in linear
time: the SDK's own check backtracks (Python's `re`) on the event loop, holding every
tenant's requests while it runs. In a process of its own, so that a check that backtracks
fails this test instead of holding the test run."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ROOT

SCRIPT = r'''
import asyncio
import mcp_types as types
from gateway.mcp.upstream.session import GatewayClientSession

session = object.__new__(GatewayClientSession)
session._tool_output_schemas = {
    "redos": {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}}},
    "plain": {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]},
    # A review's finds: a backreference (backtracking in the default engine), and references
    # that fan out doubly at each level (2^40 checks of the answer 1).
    "backref": {"type": "object", "properties": {"v": {"type": "array", "items": {
        "allOf": [{"not": {"pattern": "(\\w+)*\\1z"}}] * 20}}}},
    "fanout": {"$ref": "#/$defs/a40", "$defs": {"a0": {"type": "integer"}, **{
        f"a{i}": {"allOf": [{"$ref": f"#/$defs/a{i - 1}"}, {"$ref": f"#/$defs/a{i - 1}"}]} for i in range(1, 41)}}},
}
session._tool_output_validators = {}
session._output_checks = {}

async def check(name, structured):
    try:
        await session.validate_tool_result(name, types.CallToolResult(content=[], structured_content=structured))
    except RuntimeError as exc:
        return f"refused: {exc}"
    return "passed"

async def main():
    print(await check("redos", {"v": "a" * 64 + "!"}))
    print(await check("redos", {"v": "a" * 64}))
    print(await check("plain", {"v": 1}))
    print(await check("unlisted", {"v": 1}))
    print(await check("backref", {"v": ["aaaaaaaaaaaaaaaaa"] * 200}))
    print(await check("fanout", 1))

asyncio.run(main())
'''


def test_a_backtracking_pattern_is_matched_in_linear_time_and_the_checks_still_refuse():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "refused: Invalid structured content returned by tool redos",
        "passed",
        "refused: Invalid structured content returned by tool plain",
        "passed",  # not listed on this session: the SDK would list in the caller's context
        "refused: Invalid output schema for tool backref",  # no backtracking engine to run it
        "passed",  # references are not checked: their fan-out has no bound
    ]
