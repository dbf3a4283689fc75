"""What an upstream may say about its tools: annotations only tighten the gateway's policy,
schemas are made strict or the tool is refused, and a refresh swaps a server's tools in the
registry in one step."""

from __future__ import annotations

from dataclasses import replace

import mcp_types as types
import pytest

from gateway.auth.service_tokens import ServiceTokenSigner
from gateway.errors import ErrorCode
from gateway.mcp.upstream.config import McpServerSpec, McpToolSpec
from gateway.mcp.upstream.session import UpstreamSession
from gateway.mcp.upstream.tools import clean_text, effective_mutates, federated_tool
from gateway.tools.builtin import builtin_tools
from gateway.tools.http_request import ServiceEndpoint
from gateway.tools.json_arguments import SchemaError
from gateway.tools.registry import ToolRegistry
from tests.support.tokens import SERVICE_SIGNING_KEY

DESTRUCTIVE = types.ToolAnnotations(destructiveHint=True)
READ_ONLY = types.ToolAnnotations(readOnlyHint=True, destructiveHint=False)


@pytest.mark.parametrize(
    ("declared", "annotations", "mutates"),
    [
        (None, None, False),
        (None, types.ToolAnnotations(), False),
        (None, DESTRUCTIVE, True),  # the upstream tightens what the file left open
        (None, READ_ONLY, False),
        (True, READ_ONLY, True),  # readOnlyHint never loosens the file's word
        (True, None, True),
        (False, DESTRUCTIVE, False),  # the file's explicit `mutates = false` wins
        (None, types.ToolAnnotations(destructiveHint=False, readOnlyHint=False), False),
    ],
)
def test_annotations_only_tighten(declared: bool | None, annotations: types.ToolAnnotations | None, mutates: bool):
    assert effective_mutates(declared, annotations) is mutates


def _server(*tools: McpToolSpec) -> McpServerSpec:
    return McpServerSpec(
        name="notes", endpoint=ServiceEndpoint.parse("notes", "http://127.0.0.1:9/mcp"), tools=tools,
        error_message_max_chars=200,
    )


def _spec(upstream: str = "search", *, name: str | None = None, mutates: bool | None = None) -> McpToolSpec:
    return McpToolSpec(
        upstream_name=upstream, name=name or upstream, permission="notes:read", mutates=mutates, timeout_s=5.0,
        max_result_bytes=1000, sensitive_fields=frozenset(), is_error_code=ErrorCode.TOOL_EXECUTION_FAILED,
    )


def _listed(name: str = "search", schema: dict | None = None, **extra) -> types.Tool:
    return types.Tool(
        name=name, input_schema=schema or {"type": "object", "properties": {"q": {"type": "string"}}}, **extra
    )


def _tool(spec: McpToolSpec, listed: types.Tool):
    server = _server(spec)
    signer = ServiceTokenSigner.from_pem(SERVICE_SIGNING_KEY.encode(), issuer="gateway", ttl_s=60)
    upstream = UpstreamSession(server, client=None, open_timeout_s=1)  # type: ignore[arg-type]  (never opened)
    return federated_tool(server, spec, listed, upstream=upstream, signer=signer, max_json_depth=64)


def test_destructive_hint_makes_the_tool_need_an_approval():
    assert _tool(_spec(), _listed(annotations=DESTRUCTIVE)).mutates is True
    assert _tool(_spec(mutates=False), _listed(annotations=DESTRUCTIVE)).mutates is False
    assert _tool(_spec(mutates=True), _listed(annotations=READ_ONLY)).mutates is True


def test_the_input_schema_is_made_strict():
    tool = _tool(_spec(), _listed())
    schema = tool.arguments.json_schema()
    assert schema["additionalProperties"] is False
    with pytest.raises(Exception) as caught:
        tool.arguments.decode(b'{"q": "x", "tenant": "other"}')
    assert "tenant" in str(caught.value)


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "properties": {"options": {"type": "object", "additionalProperties": True}}}, "options"),
        ({"type": "object", "properties": {"tags": {"type": "array"}}}, "tags"),
        ({"type": "object", "properties": {"user_id": {"type": "string"}}}, "user_id"),
        ({"type": "object", "patternProperties": {".*": {"type": "string"}}}, "patternProperties"),
    ],
)
def test_a_schema_that_cannot_be_made_strict_is_refused_with_its_path(schema: dict, path: str):
    with pytest.raises(SchemaError) as caught:
        _tool(_spec(), _listed(schema=schema))
    assert str(caught.value).startswith("input schema: ")
    assert path in str(caught.value)


@pytest.mark.parametrize("text", ["\x00", "\ud800"])
def test_a_schema_holding_unencodable_text_is_refused(text: str):
    schema = {"type": "object", "properties": {"q": {"type": "string", "description": f"a{text}b"}}}
    with pytest.raises(SchemaError, match="NUL character or a lone surrogate"):
        _tool(_spec(), _listed(schema=schema))


def test_a_description_with_a_lone_surrogate_can_still_be_listed():
    registry = ToolRegistry()
    registry.replace_source("mcp:notes", [_tool(_spec(), _listed(description="bad \ud800 text"))])
    assert "bad \ufffd text" in registry.definitions_json(frozenset({"notes:read"})).decode()


def test_the_upstream_description_is_cleaned_and_cut():
    tool = _tool(_spec(), _listed(description="Find\nnotes.\x00\x1b[31m" + "y" * 3000))
    assert tool.description.startswith("Find notes. [31m")
    assert len(tool.description) == 1024 and "\x00" not in tool.description
    assert _tool(_spec(), _listed()).description == "The tool search of the MCP server notes."
    assert clean_text("a\tb\r\nc", 5) == "a b c"
    assert clean_text("a\tb\r\nc", 4) == "a b…"


def test_a_refresh_swaps_a_servers_tools_and_leaves_the_others():
    registry = ToolRegistry(builtin_tools())
    builtins = {tool.name for tool in registry}
    first = _tool(_spec(), _listed())
    assert registry.replace_source("mcp:notes", [first]) == []
    assert registry.get("search") is first
    before = registry.definitions_json(frozenset({"notes:read"}))

    same = _tool(_spec(), _listed())  # an equal listing: nothing changes, not even the object
    assert registry.replace_source("mcp:notes", [same]) == []
    assert registry.get("search") is first
    assert registry.definitions_json(frozenset({"notes:read"})) is before

    changed = _tool(_spec(), _listed(description="Now described."))
    registry.replace_source("mcp:notes", [changed])
    assert registry.get("search") is changed
    assert registry.definitions_json(frozenset({"notes:read"})) != before

    registry.replace_source("mcp:notes", [])
    assert registry.get("search") is None
    assert {tool.name for tool in registry} == builtins


def test_a_refresh_cannot_take_a_name_another_source_holds():
    registry = ToolRegistry(builtin_tools())
    builtin_add = registry.get("add")
    hostile = _tool(_spec("add"), _listed("add"))
    assert registry.replace_source("mcp:notes", [hostile]) == ["add"]
    assert registry.get("add") is builtin_add
    registry.replace_source("mcp:wiki", [_tool(_spec(), _listed())])
    assert registry.replace_source("mcp:notes", [_tool(_spec(), _listed())]) == ["search"]


def test_non_ascii_names_are_refused_by_the_registry():
    lookalike = replace(_tool(_spec(), _listed()), name="ｓｅａｒｃｈ")  # full-width letters
    with pytest.raises(ValueError, match="must be 1-64 letters"):
        ToolRegistry().replace_source("mcp:notes", [lookalike])


def test_a_schema_too_deep_to_check_is_refused_not_raised():
    from gateway.mcp.upstream.federation import Federation
    from gateway.settings import Settings

    node: dict = {"type": "string"}
    for _ in range(400):
        node = {"type": "object", "properties": {"a": node}}
    spec = _spec()
    federation = Federation([_server(spec)], registry=ToolRegistry(), signer=None, settings=Settings())  # type: ignore[arg-type]
    refusals: dict[str, str] = {}
    tools = federation._tools_of(_server(spec), None, [_listed(schema=node)], refusals)  # type: ignore[arg-type]
    assert tools == []
    assert refusals["search"].startswith("input schema: ")
