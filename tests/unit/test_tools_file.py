"""The tools file: TOML or YAML, checked at start, every error naming the file and the entry."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import create_app
from gateway.settings import Settings, SettingsError
from gateway.tools.config import ToolsFileError, load_http_tools, service_base_urls
from gateway.tools.http import ServiceCalls
from tests.support.logging_state import logging_restored
from tests.support.tokens import SERVICE_SIGNING_KEY, TEST_SECRET

HTTP_TOOLS_DOC = Path(__file__).resolve().parents[2] / "docs" / "http-tools.md"

TOML = """
[services.orders]
base_url = "http://orders.internal:8080/api"
error_message_field = "error.message"

[[tools]]
name = "get_order"
description = "Read one of your orders."
service = "orders"
permission = "orders:read"
timeout_s = 2
max_result_bytes = 4096
request = { method = "get", path = "/orders/{order_id}", query = ["expand"] }

[tools.arguments]
type = "object"
required = ["order_id"]
properties = { order_id = { type = "string" }, expand = { type = "boolean" } }
"""

YAML = """
services:
  orders:
    base_url: http://orders.internal:8080/api
    error_message_field: error.message
tools:
  - name: get_order
    description: Read one of your orders.
    service: orders
    permission: orders:read
    timeout_s: 2
    max_result_bytes: 4096
    request: {method: GET, path: "/orders/{order_id}", query: [expand]}
    arguments:
      type: object
      required: [order_id]
      properties:
        order_id: {type: string}
        expand: {type: boolean}
"""


def settings_for(path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": "postgresql+asyncpg://gateway@127.0.0.1:1/never-opened",
        "jwt_secret": TEST_SECRET,
        "tools_file": str(path),
        "service_signing_key": SERVICE_SIGNING_KEY,
    }
    return Settings.from_flat(**{**values, **overrides})


def load(tmp_path: Path, text: str, name: str = "tools.toml", **overrides: Any) -> list[Any]:
    path = tmp_path / name
    path.write_text(text)
    return load_http_tools(settings_for(path, **overrides), ServiceCalls(None, max_calls_per_tenant=25))


def test_toml_and_yaml_declare_the_same_tools(tmp_path: Path):
    (from_toml,) = load(tmp_path, TOML, "tools.toml")
    (from_yaml,) = load(tmp_path, YAML, "tools.yaml")
    for tool in (from_toml, from_yaml):
        assert (tool.name, tool.permission, tool.timeout_s, tool.max_result_bytes, tool.mutates) == (
            "get_order", "orders:read", 2.0, 4096, False
        )
    assert from_toml.openai_definition() == from_yaml.openai_definition()
    assert from_toml.arguments.json_schema()["additionalProperties"] is False


def test_defaults_come_from_the_settings(tmp_path: Path):
    text = TOML.replace("timeout_s = 2\n", "").replace("max_result_bytes = 4096\n", "")
    (tool,) = load(tmp_path, text, tool_timeout_s=7.5, tool_max_result_bytes=999)
    assert (tool.timeout_s, tool.max_result_bytes) == (7.5, 999)


def without_line(text: str, start: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(start))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (TOML.replace('permission = "orders:read"', 'permission = "orders:read"\nmutate = true'),
         "tool #1 'get_order': object contains unknown field `mutate`"),
        (without_line(TOML, "description"), "tool #1 'get_order': object missing required field `description`"),
        (TOML.replace("timeout_s = 2", 'timeout_s = "fast"'), "tool #1 'get_order': timeout_s: expected `float"),
        (TOML.replace("timeout_s = 2", "timeout_s = 0"), "tool #1 'get_order': timeout_s must be more than 0"),
        (TOML.replace('service = "orders"', 'service = "billing"'),
         "tool #1 'get_order': service 'billing' is not declared"),
        (TOML.replace('name = "get_order"', 'name = "get order"'), "tool #1 'get order': name must be"),
        (TOML.replace('name = "get_order"', 'name = "get_order\\n"'), "name must be"),
        (TOML.replace('permission = "orders:read"', 'permission = "orders:read\\n"'),
         "tool #1 'get_order': permission must be"),
        (TOML.replace('permission = "orders:read"', 'permission = ""'), "tool #1 'get_order': permission must be"),
        (TOML.replace('type = "object"', 'type = "object"\nadditionalProperties = true'),
         "tool #1 'get_order': arguments: (top level): additionalProperties must be false"),
        (TOML.replace('expand = { type = "boolean" }', 'expand = { description = "anything" }'),
         "tool #1 'get_order': arguments: /properties/expand: could accept an object with any fields"),
        (TOML.replace('expand = { type = "boolean" }', 'expand = { type = "array" }'),
         "tool #1 'get_order': arguments: /properties/expand: could accept an array of anything"),
        (TOML.replace('expand = { type = "boolean" }', 'expand = { type = "boolean" }, tenant_id = { type = "string" }'),
         "tool #1 'get_order': arguments: (top level): the field 'tenant_id' names the caller's identity"),
        (TOML.replace('{ type = "boolean" }', '{ type = "bool" }'),
         "tool #1 'get_order': arguments: is not a valid JSON Schema at properties.expand.type"),
        (TOML.replace('query = ["expand"]', "query = []"),
         "tool #1 'get_order': request: argument 'expand' is sent nowhere"),
        (TOML.replace("/orders/{order_id}", "/orders/../{order_id}"),
         "tool #1 'get_order': request: path '/orders/../{order_id}' must not contain"),
        (TOML.replace('method = "get"', 'method = "CONNECT"'), "tool #1 'get_order': request: method must be"),
        (TOML.replace("http://orders.internal:8080/api", "http://admin:pw@orders.internal/api"),
         "service 'orders': base URL"),
        (without_line(TOML, "base_url"), "service 'orders': has no base_url"),
        (TOML.replace("error_message_field", "error_field"), "service 'orders': object contains unknown field"),
        (TOML + TOML.split("[[tools]]", 1)[1].join(["[[tools]]", ""]),
         "tool #2 'get_order': the name 'get_order' is already taken"),
        (TOML.replace("get_order", "add"), "tool #1 'add': the name 'add' is already taken"),
        ('tools = "none"', "tools: expected `array`"),
        ("[[tools]\n", "is not valid TOML"),
    ],
)
def test_errors_name_the_file_and_the_entry(tmp_path: Path, text: str, message: str):
    path = tmp_path / "tools.toml"
    path.write_text(text)
    with pytest.raises(ToolsFileError) as error:
        create_app(settings_for(path))
    assert str(error.value).startswith(f"tools file {path}: ")
    assert message in str(error.value)


def test_yaml_errors_name_the_entry_too(tmp_path: Path):
    data = yaml.safe_load(YAML)
    data["tools"].insert(0, {**copy.deepcopy(data["tools"][0]), "name": "first"})
    data["tools"][1]["request"]["path"] = "/orders/{id}"
    with pytest.raises(ToolsFileError, match=r"tool #2 'get_order': request: path parameter \{id\}"):
        load(tmp_path, yaml.safe_dump(data), "tools.yml")


@pytest.mark.parametrize(
    ("name", "text"),
    [("tools.toml", "a = " + "[" * 5000 + "]" * 5000), ("tools.yaml", "a: " + "[" * 5000 + "]" * 5000),
     ("tools.yml", "a: " + "{b: " * 5000 + "1" + "}" * 5000)],
    ids=["toml-arrays", "yaml-flow-arrays", "yaml-flow-maps"],
)
def test_a_file_nested_past_what_its_parser_can_read_is_one_line_naming_it(tmp_path: Path, name, text):
    with pytest.raises(ToolsFileError, match="nests arrays or tables too deeply"):
        load(tmp_path, text, name)


def test_only_toml_and_yaml_files_are_read(tmp_path: Path):
    with pytest.raises(ToolsFileError, match=r"\.toml, \.yaml or \.yml"):
        load(tmp_path, "{}", "tools.json")
    with pytest.raises(ToolsFileError, match="cannot be read"):
        load_http_tools(settings_for(tmp_path / "missing.toml"), ServiceCalls(None, max_calls_per_tenant=25))


def test_settings_name_the_base_url_and_win_over_the_file(tmp_path: Path):
    (tool,) = load(tmp_path, TOML, service_base_urls=("orders=https://orders.prod.internal/v2",))
    url, _ = tool.handler._request.build(tool.handler._service, {"order_id": "o1"})  # type: ignore[attr-defined]
    assert str(url) == "https://orders.prod.internal/v2/orders/o1"
    (tool,) = load(tmp_path, without_line(TOML, "base_url"), service_base_urls=("orders=http://10.1.2.3:81",))
    assert tool.name == "get_order"


@pytest.mark.parametrize("entry", ["orders", "=http://x", "orders="])
def test_service_base_urls_must_be_name_equals_url(entry: str):
    with pytest.raises(SettingsError, match="NAME=URL"):
        service_base_urls(Settings.from_flat(service_base_urls=(entry,)))


def test_http_tools_need_a_signing_key(tmp_path: Path):
    path = tmp_path / "tools.toml"
    path.write_text(TOML)
    with pytest.raises(SettingsError, match="GATEWAY_SERVICE_SIGNING_KEY"):
        create_app(settings_for(path, service_signing_key=None))


def documented_example() -> str:
    match = re.search(r"```toml\n(.*?)```", HTTP_TOOLS_DOC.read_text(), re.S)
    assert match is not None, "docs/http-tools.md has no TOML example"
    return match.group(1)


def test_documented_example_declares_two_working_tools(tmp_path: Path):
    tools = load(tmp_path, documented_example())
    assert len(tools) == 2
    assert any(tool.mutates for tool in tools)
    for tool in tools:
        assert tool.arguments.json_schema()["additionalProperties"] is False


def test_serve_stops_with_the_tools_file_error_before_migrating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from gateway import cli

    path = tmp_path / "tools.toml"
    path.write_text(TOML.replace('service = "orders"', 'service = "billing"'))
    database = tmp_path / "never-created"
    monkeypatch.delenv("GATEWAY_DATABASE_URL", raising=False)
    monkeypatch.setenv("GATEWAY_EMBEDDED_DATA_DIR", str(database))
    monkeypatch.setenv("GATEWAY_JWT_SECRET", TEST_SECRET)
    monkeypatch.setenv("GATEWAY_TOOLS_FILE", str(path))
    monkeypatch.setenv("GATEWAY_SERVICE_SIGNING_KEY", SERVICE_SIGNING_KEY)
    with logging_restored():
        assert cli.main(["serve", "--port", "1"]) == 2
    error = capsys.readouterr().err
    assert f"gateway: configuration error: tools file {path}: tool #1 'get_order': service 'billing'" in error
    assert not database.exists()
