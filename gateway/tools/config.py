"""The tools file (``GATEWAY_TOOLS_FILE``): HTTP tools declared in TOML or YAML.

Read and checked once, at start: an error stops start-up with a message naming the file,
the entry and what is wrong with it. The format (docs/http-tools.md)::

    [services.orders]                      # a business service
    base_url = "http://orders.internal:8080/api"   # or GATEWAY_SERVICE_BASE_URLS=orders=...
    audience = "orders"                    # aud of its tokens (default: the service's name)
    error_message_field = "detail"         # the one field of an error body the model may read
    error_message_max_chars = 200

    [[tools]]
    name = "get_order"
    description = "Read one of your orders."
    service = "orders"
    permission = "orders:read"
    mutates = false                        # true: needs an approval, sends an Idempotency-Key
    timeout_s = 5                          # default GATEWAY_TOOL_TIMEOUT_S
    max_result_bytes = 8192                # default GATEWAY_TOOL_MAX_RESULT_BYTES
    sensitive_fields = []                  # redacted in audit and logs
    request = { method = "GET", path = "/orders/{order_id}", query = [], body = [] }
    arguments = { type = "object", required = ["order_id"], properties = { order_id = { type = "string" } } }

    [mcp_servers.notes]                    # an MCP server behind the guard (docs/mcp-servers.md)
    url = "http://notes.internal:8080/mcp"
    include = ["search_notes"]             # the upstream tools offered (default: none)

    [mcp_servers.notes.tools.search_notes]
    permission = "notes:read"              # required for each included tool
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from gateway.mcp.upstream.config import McpConfigError, McpServerSpec, parse_mcp_servers
from gateway.settings import Settings, SettingsError
from gateway.tools.base import Tool
from gateway.tools.builtin import builtin_tools
from gateway.tools.http import ErrorExposure, ServiceCalls, http_tool
from gateway.tools.http_request import RequestTemplate, RequestTemplateError, ServiceEndpoint
from gateway.tools.json_arguments import SchemaError, strict_schema
from gateway.tools.registry import ToolRegistry

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SERVICE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PERMISSION = re.compile(r"^[^\s]{1,128}$")


_T = TypeVar("_T")


class ToolsFileError(SettingsError):
    """The tools file cannot be used; the message names the file and the entry."""


class _Entry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ServiceEntry(_Entry):
    base_url: str | None = None
    audience: str | None = None
    error_message_field: str | None = None
    error_message_max_chars: int = 200


class RequestEntry(_Entry):
    method: str
    path: str
    query: list[str] = []
    body: list[str] = []


class ToolEntry(_Entry):
    name: str
    description: str
    service: str
    permission: str
    request: RequestEntry
    arguments: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    mutates: bool = False
    timeout_s: float | None = None
    max_result_bytes: int | None = None
    sensitive_fields: list[str] = []


class ToolsFile(_Entry):
    services: dict[str, Any] = {}
    tools: list[Any] = []
    mcp_servers: dict[str, Any] = {}


def read_tools_file(path: Path) -> Any:
    """The file's content as plain data: TOML (``.toml``) or YAML (``.yaml``, ``.yml``)."""
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ToolsFileError(f"tools file {path}: must end in .toml, .yaml or .yml")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ToolsFileError(f"tools file {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        if suffix == ".toml":
            return tomllib.loads(raw.decode("utf-8"))
        return yaml.safe_load(raw) or {}
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ToolsFileError(f"tools file {path}: is not valid {suffix[1:].upper()}: {first}") from None
    except RecursionError:  # both parsers recurse once per level of nesting
        raise ToolsFileError(f"tools file {path}: nests arrays or tables too deeply to be read") from None


def service_base_urls(settings: Settings) -> dict[str, str]:
    """``GATEWAY_SERVICE_BASE_URLS`` as ``{name: url}``."""
    urls: dict[str, str] = {}
    for entry in settings.services.base_urls:
        name, sep, url = entry.partition("=")
        name = name.strip()
        if not sep or not _SERVICE_NAME.fullmatch(name) or not url.strip():
            raise SettingsError("GATEWAY_SERVICE_BASE_URLS must be a comma-separated list of NAME=URL entries")
        if name in urls:
            raise SettingsError(f"GATEWAY_SERVICE_BASE_URLS names service {name!r} twice")
        urls[name] = url.strip()
    return urls


def load_http_tools(settings: Settings, calls: ServiceCalls, *, reserved_names: Iterable[str] = ()) -> list[Tool]:
    """The tools the file declares, checked and compiled; ``[]`` without a tools file.

    ``reserved_names`` are the tools already registered (the built-ins): a clash is an error.
    """
    if settings.tools.file is None:
        return []
    path = Path(settings.tools.file)
    where = f"tools file {path}"
    document = _convert(read_tools_file(path), ToolsFile, where)
    base_urls = service_base_urls(settings)
    services: dict[str, tuple[ServiceEndpoint, ErrorExposure]] = {}
    for name in sorted(set(document.services) | set(base_urls)):
        label = f"{where}: service {name!r}"
        if not _SERVICE_NAME.fullmatch(name):
            raise ToolsFileError(f"{label}: a service name may only use letters, digits, '_', '-' and '.'")
        entry = _convert(document.services.get(name) or {}, ServiceEntry, label)
        url = base_urls.get(name) or entry.base_url
        if url is None:
            raise ToolsFileError(f"{label}: has no base_url, and GATEWAY_SERVICE_BASE_URLS does not name it")
        if entry.error_message_max_chars < 1:
            raise ToolsFileError(f"{label}: error_message_max_chars must be at least 1")
        try:
            endpoint = ServiceEndpoint.parse(name, url, audience=entry.audience)
        except RequestTemplateError as exc:
            raise ToolsFileError(f"{label}: {exc}") from None
        services[name] = (endpoint, ErrorExposure(entry.error_message_field, entry.error_message_max_chars))

    taken = set(reserved_names)
    tools: list[Tool] = []
    for index, raw in enumerate(document.tools, start=1):
        name = raw.get("name") if isinstance(raw, dict) else None
        label = f"{where}: tool #{index}" + (f" {name!r}" if isinstance(name, str) else "")
        entry = _convert(raw, ToolEntry, label)
        try:
            tool = _build_tool(entry, settings, calls, services)
        except (SchemaError, RequestTemplateError, ValueError) as exc:
            raise ToolsFileError(f"{label}: {exc}") from None
        if tool.name in taken:
            raise ToolsFileError(f"{label}: the name {tool.name!r} is already taken by another tool")
        taken.add(tool.name)
        tools.append(tool)
    return tools


def load_mcp_servers(settings: Settings, *, reserved_names: Iterable[str] = ()) -> list[McpServerSpec]:
    """The MCP servers the file puts behind the guard (``[mcp_servers.NAME]``), checked; ``[]``
    without a tools file. ``reserved_names`` (the built-in and HTTP tools) cannot be taken."""
    if settings.tools.file is None:
        return []
    path = Path(settings.tools.file)
    where = f"tools file {path}"
    document = _convert(read_tools_file(path), ToolsFile, where)
    try:
        return parse_mcp_servers(
            document.mcp_servers,
            where=where,
            default_timeout_s=settings.tools.timeout_s,
            default_max_result_bytes=settings.tools.max_result_bytes,
            taken=set(reserved_names),
        )
    except McpConfigError as exc:
        raise ToolsFileError(str(exc)) from None


def operator_registry(settings: Settings) -> ToolRegistry:
    """The tools a gateway with ``settings`` has (built-ins and the tools file), for operator
    commands that name a tool; nothing here can call a service (no signer, no client)."""
    registry = ToolRegistry(builtin_tools())
    calls = ServiceCalls(None, max_calls_per_tenant=settings.tools.max_remote_calls_per_tenant)
    for tool in load_http_tools(settings, calls, reserved_names=(tool.name for tool in registry)):
        registry.register(tool)
    return registry


def _build_tool(
    entry: ToolEntry,
    settings: Settings,
    calls: ServiceCalls,
    services: dict[str, tuple[ServiceEndpoint, ErrorExposure]],
) -> Tool:
    if not _TOOL_NAME.fullmatch(entry.name):
        raise ValueError("name must be 1-64 letters, digits, '_' or '-'")
    if not entry.description.strip() or len(entry.description) > 1024:
        raise ValueError("description must be 1-1024 characters")
    if not _PERMISSION.fullmatch(entry.permission):
        raise ValueError("permission must be 1-128 characters without spaces, e.g. \"orders:read\"")
    if entry.service not in services:
        raise ValueError(
            f"service {entry.service!r} is not declared: add [services.{entry.service}] with its base_url, "
            "or name it in GATEWAY_SERVICE_BASE_URLS"
        )
    timeout_s = entry.timeout_s if entry.timeout_s is not None else settings.tools.timeout_s
    if not 0 < timeout_s <= 3600:
        raise ValueError("timeout_s must be more than 0 and at most 3600")
    max_result_bytes = entry.max_result_bytes
    if max_result_bytes is None:
        max_result_bytes = settings.tools.max_result_bytes
    if max_result_bytes < 1:
        raise ValueError("max_result_bytes must be at least 1")
    service, errors = services[entry.service]
    try:
        schema = strict_schema(entry.arguments)
    except SchemaError as exc:
        raise SchemaError(f"arguments: {exc}") from None
    try:
        request = RequestTemplate.compile(
            method=entry.request.method,
            path=entry.request.path,
            query=entry.request.query,
            body=entry.request.body,
            schema=schema,
        )
    except RequestTemplateError as exc:
        raise RequestTemplateError(f"request: {exc}") from None
    try:
        return http_tool(
            name=entry.name,
            description=entry.description.strip(),
            schema=schema,
            permission=entry.permission,
            service=service,
            request=request,
            calls=calls,
            timeout_s=float(timeout_s),
            connect_timeout_s=settings.http.connect_timeout_s,
            max_result_bytes=max_result_bytes,
            mutates=entry.mutates,
            sensitive_fields=frozenset(entry.sensitive_fields),
            errors=errors,
        )
    except SchemaError as exc:
        raise SchemaError(f"arguments: {exc}") from None


def _convert(raw: Any, kind: type[_T], label: str) -> _T:
    if not isinstance(raw, dict):
        raise ToolsFileError(f"{label}: must be a table (a mapping of keys to values)")
    try:
        return msgspec.convert(raw, kind, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc)
        detail, _, at = message.partition(" - at `$")
        field = at.rstrip("`").lstrip(".")
        raise ToolsFileError(f"{label}: {field + ': ' if field else ''}{_lower_first(detail)}") from None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
