"""``[mcp_servers.NAME]`` of the tools file: parsed strictly at start, every error naming the
file, the server, the tool and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.errors import ErrorCode
from gateway.settings import Settings, SettingsError
from gateway.tools.config import ToolsFileError, load_mcp_servers
from tests.support.tokens import SERVICE_SIGNING_KEY, TEST_SECRET

TOML = """
[mcp_servers.notes]
url = "http://notes.internal:8080/mcp"
include = ["search_notes", "delete_note"]

[mcp_servers.notes.tools.search_notes]
permission = "notes:read"

[mcp_servers.notes.tools.delete_note]
name = "notes_delete"
permission = "notes:write"
mutates = false
timeout_s = 2
max_result_bytes = 4096
sensitive_fields = ["reason"]
is_error_code = "BUSINESS_RULE_VIOLATION"
"""


def load(tmp_path: Path, text: str, suffix: str = ".toml", reserved: tuple[str, ...] = ()):
    path = tmp_path / f"tools{suffix}"
    path.write_text(text)
    settings = Settings.from_flat(tools_file=str(path), tool_timeout_s=7, tool_max_result_bytes=999)
    return load_mcp_servers(settings, reserved_names=reserved)


def test_a_server_and_its_included_tools_are_read_with_defaults(tmp_path: Path):
    (server,) = load(tmp_path, TOML)
    assert server.name == "notes"
    assert server.url == "http://notes.internal:8080/mcp"
    assert server.audience == "notes"
    search, delete = server.tools
    assert (search.upstream_name, search.name, search.permission) == ("search_notes", "search_notes", "notes:read")
    assert search.mutates is None  # not said: the upstream's destructiveHint may decide
    assert (search.timeout_s, search.max_result_bytes) == (7.0, 999)
    assert search.is_error_code is ErrorCode.TOOL_EXECUTION_FAILED
    assert (delete.name, delete.mutates, delete.timeout_s, delete.max_result_bytes) == ("notes_delete", False, 2.0, 4096)
    assert delete.sensitive_fields == frozenset({"reason"})
    assert delete.is_error_code is ErrorCode.BUSINESS_RULE_VIOLATION


def test_yaml_says_the_same(tmp_path: Path):
    yaml_text = """
mcp_servers:
  notes:
    url: http://notes.internal:8080/mcp
    audience: notes-api
    include: [search_notes]
    tools:
      search_notes: {permission: "notes:read"}
"""
    (server,) = load(tmp_path, yaml_text, ".yaml")
    assert server.audience == "notes-api"
    assert [tool.name for tool in server.tools] == ["search_notes"]


def test_nothing_is_included_by_default(tmp_path: Path):
    (server,) = load(tmp_path, '[mcp_servers.notes]\nurl = "http://notes.internal/mcp"\n')
    assert server.tools == ()


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("[mcp_servers.notes]\n", "[mcp_servers.notes]\nheaders = {x = '1'}\n"),
         "mcp server 'notes': object contains unknown field `headers`"),
        (('permission = "notes:read"\n', 'permission = "notes:read"\nretries = 3\n'),
         "tool 'search_notes': tools.search_notes: object contains unknown field `retries`"),
        (('permission = "notes:read"\n', ""), "tool 'search_notes': tools.search_notes: object missing required field `permission`"),
        (('mutates = false', 'mutates = "no"'), "tool 'delete_note': tools.delete_note: mutates: expected `bool | null`"),
        (('is_error_code = "BUSINESS_RULE_VIOLATION"', 'is_error_code = "NOT_FOUND"'),
         "is_error_code: invalid enum value 'NOT_FOUND'"),
        (('include = ["search_notes", "delete_note"]', 'include = ["search_notes"]'),
         "mcp server 'notes': tools.delete_note is not in include"),
        (('include = ["search_notes", "delete_note"]', 'include = ["search_notes", "delete_note", "other"]'),
         "tool 'other': is included but has no [mcp_servers.notes.tools.other] with its permission"),
        (('name = "notes_delete"', 'name = "notes delete"'), "tool 'delete_note': name 'notes delete' must be"),
        (('timeout_s = 2', 'timeout_s = 0'), "tool 'delete_note': timeout_s must be more than 0"),
        (('max_result_bytes = 4096', 'max_result_bytes = 0'), "tool 'delete_note': max_result_bytes must be at least 1"),
        (('permission = "notes:write"', 'permission = "notes write"'), "tool 'delete_note': permission must be"),
    ],
)
def test_mistakes_stop_start_up_naming_server_tool_and_key(tmp_path: Path, edit: tuple[str, str], expected: str):
    text = TOML.replace(*edit, 1)
    assert text != TOML
    with pytest.raises(ToolsFileError) as caught:
        load(tmp_path, text)
    message = str(caught.value)
    assert message.startswith(f"tools file {tmp_path / 'tools.toml'}: ")
    assert expected in message, message


@pytest.mark.parametrize(
    "url",
    ["ftp://notes.internal/mcp", "http://user:pw@notes.internal/mcp", "http://notes.internal/mcp?x=1",
     "http://notes.internal/mcp#frag", "http:///mcp", "http://notes.internal:99999/mcp",
     "http://notes.internal/../admin"],
)
def test_the_url_follows_the_allow_list_rules_of_services(tmp_path: Path, url: str):
    with pytest.raises(ToolsFileError, match="mcp server 'notes': url: "):
        load(tmp_path, TOML.replace("http://notes.internal:8080/mcp", url))


@pytest.mark.parametrize(
    ("include", "why"),
    [
        ("ｗｈｏａｍｉ", "an included name may only use letters"),  # full-width look-alike
        ("who ami", "an included name may only use letters"),
        ("who\u0000ami", "an included name may only use letters"),
        ("whoami\n", "an included name may only use letters"),  # `$` alone would let it through
    ],
)
def test_hostile_included_names_are_refused(tmp_path: Path, include: str, why: str):
    text = (
        '[mcp_servers.notes]\nurl = "http://notes.internal/mcp"\n'
        f'include = ["{include}"]\n'
        f'[mcp_servers.notes.tools."{include}"]\npermission = "notes:read"\n'
    ).replace("\u0000", "\\u0000").replace("\n\"", "\\n\"")
    with pytest.raises(ToolsFileError, match=why):
        load(tmp_path, text)


def test_a_name_taken_by_a_built_in_or_another_server_is_refused(tmp_path: Path):
    with pytest.raises(ToolsFileError, match="the name 'search_notes' is already taken"):
        load(tmp_path, TOML, reserved=("search_notes",))
    two = TOML + """
[mcp_servers.wiki]
url = "http://wiki.internal/mcp"
include = ["search"]
[mcp_servers.wiki.tools.search]
name = "notes_delete"
permission = "wiki:read"
"""
    with pytest.raises(ToolsFileError, match="mcp server 'wiki': tool 'search': the name 'notes_delete' is already taken"):
        load(tmp_path, two)


def test_a_built_in_name_cannot_be_taken_at_start(tmp_path: Path):
    path = tmp_path / "tools.toml"
    path.write_text(TOML.replace('name = "notes_delete"', 'name = "add"'))
    settings = Settings.from_flat(
        tools_file=str(path), jwt_secret=TEST_SECRET, service_signing_key=SERVICE_SIGNING_KEY,
        database_url="postgresql+asyncpg://postgres@127.0.0.1:5432/unused",
    )
    with pytest.raises(SettingsError, match="the name 'add' is already taken"):
        create_app(settings)


def test_mcp_servers_need_the_signing_key(tmp_path: Path):
    path = tmp_path / "tools.toml"
    path.write_text(TOML)
    settings = Settings.from_flat(
        tools_file=str(path), jwt_secret=TEST_SECRET, database_url="postgresql+asyncpg://postgres@127.0.0.1:5432/unused"
    )
    with pytest.raises(SettingsError, match="declares MCP servers: set GATEWAY_SERVICE_SIGNING_KEY"):
        create_app(settings)


def test_refresh_interval_is_a_positive_setting():
    assert Settings.from_flat().mcp_upstream.refresh_s == 300.0
    assert Settings.from_env({"GATEWAY_MCP_REFRESH_S": "0.5"}).mcp_upstream.refresh_s == 0.5
    with pytest.raises(SettingsError, match="GATEWAY_MCP_REFRESH_S"):
        Settings.from_env({"GATEWAY_MCP_REFRESH_S": "0"})
