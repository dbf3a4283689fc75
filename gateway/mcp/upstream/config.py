"""``[mcp_servers.NAME]`` of the tools file: which MCP server, which of its tools, and the
gateway's policy for each of them.

::

    [mcp_servers.notes]
    url = "http://notes.internal:8080/mcp"   # streamable HTTP; scheme, host and port only from here
    audience = "notes"                       # aud of the identity tokens (default: the server's name)
    include = ["search_notes", "delete_note"]   # nothing else of the server is offered (default: none)
    is_error_code = "TOOL_EXECUTION_FAILED"  # or "BUSINESS_RULE_VIOLATION": what an isError result is
    error_message_max_chars = 200            # the most of an isError text the model reads

    [mcp_servers.notes.tools.delete_note]    # one table per included tool
    name = "notes_delete"                    # as the model sees it (default: the upstream name)
    permission = "notes:write"               # required
    mutates = true                           # default: the upstream's destructiveHint, else false
    timeout_s = 5
    max_result_bytes = 8192
    sensitive_fields = []
    is_error_code = "BUSINESS_RULE_VIOLATION"

Checked once, at start; an error stops start-up with a message naming the file, the server,
the tool and the key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gateway.errors import ErrorCode
from gateway.tools.http_request import RequestTemplateError, ServiceEndpoint

SERVER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
UPSTREAM_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
"""What an included upstream name may be (the MCP spec's tool-name characters)."""
PERMISSION = re.compile(r"^[^\s]{1,128}$")

IsErrorCode = Literal["TOOL_EXECUTION_FAILED", "BUSINESS_RULE_VIOLATION"]


class McpConfigError(ValueError):
    """The message names the server, the tool and the key; the tools file adds the file."""


class _Entry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class McpToolEntry(_Entry):
    permission: str
    name: str | None = None
    mutates: bool | None = None
    timeout_s: float | None = None
    max_result_bytes: int | None = None
    sensitive_fields: list[str] = []
    is_error_code: IsErrorCode | None = None


class McpServerEntry(_Entry):
    url: str
    audience: str | None = None
    include: list[str] = []
    tools: dict[str, Any] = {}
    is_error_code: IsErrorCode = "TOOL_EXECUTION_FAILED"
    error_message_max_chars: int = 200


@dataclass(frozen=True, slots=True)
class McpToolSpec:
    """One included upstream tool and the gateway's policy for it."""

    upstream_name: str
    name: str
    permission: str
    mutates: bool | None
    """``None``: not said in the file, so the upstream's ``destructiveHint`` may make it mutating."""
    timeout_s: float
    max_result_bytes: int
    sensitive_fields: frozenset[str]
    is_error_code: ErrorCode


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    name: str
    endpoint: ServiceEndpoint
    """Scheme, host, port and path: the only place the server's address comes from."""
    tools: tuple[McpToolSpec, ...]
    error_message_max_chars: int

    @property
    def url(self) -> str:
        return f"{self.endpoint.scheme}://{self.endpoint.host}" + (
            f":{self.endpoint.port}" if self.endpoint.port is not None else ""
        ) + (self.endpoint.base_path or "/")

    @property
    def audience(self) -> str:
        return self.endpoint.audience


def parse_mcp_servers(
    raw: Mapping[str, Any],
    *,
    where: str,
    default_timeout_s: float,
    default_max_result_bytes: int,
    taken: set[str],
) -> list[McpServerSpec]:
    """The ``mcp_servers`` table as specs; ``taken`` (names already used by other tools) grows
    with every name given here, so that no two tools can ever share a name."""
    servers: list[McpServerSpec] = []
    for name in sorted(raw):
        label = f"{where}: mcp server {name!r}"
        if not SERVER_NAME.fullmatch(name):
            raise McpConfigError(f"{label}: a server name may only use letters, digits, '_', '-' and '.'")
        entry = convert(raw[name], McpServerEntry, label)
        try:
            endpoint = ServiceEndpoint.parse(name, entry.url, audience=entry.audience)
        except RequestTemplateError as exc:
            raise McpConfigError(f"{label}: url: {exc}") from None
        if entry.error_message_max_chars < 1:
            raise McpConfigError(f"{label}: error_message_max_chars must be at least 1")
        if len(set(entry.include)) != len(entry.include):
            raise McpConfigError(f"{label}: include names a tool twice")
        for upstream in entry.tools:
            if upstream not in entry.include:
                raise McpConfigError(f"{label}: tools.{upstream} is not in include")
        tools = []
        for upstream in entry.include:
            tool_label = f"{label}: tool {upstream!r}"
            if not UPSTREAM_TOOL_NAME.fullmatch(upstream):
                raise McpConfigError(f"{tool_label}: an included name may only use letters, digits, '_', '-' and '.'")
            if upstream not in entry.tools:
                raise McpConfigError(
                    f"{tool_label}: is included but has no [mcp_servers.{name}.tools.{upstream}] with its permission"
                )
            tool = _tool_spec(
                upstream,
                convert(entry.tools[upstream], McpToolEntry, f"{tool_label}: tools.{upstream}"),
                label=tool_label,
                default_is_error=ErrorCode(entry.is_error_code),
                default_timeout_s=default_timeout_s,
                default_max_result_bytes=default_max_result_bytes,
            )
            if tool.name in taken:
                raise McpConfigError(f"{tool_label}: the name {tool.name!r} is already taken by another tool")
            taken.add(tool.name)
            tools.append(tool)
        servers.append(McpServerSpec(
            name=name, endpoint=endpoint, tools=tuple(tools), error_message_max_chars=entry.error_message_max_chars
        ))
    return servers


def _tool_spec(
    upstream: str,
    entry: McpToolEntry,
    *,
    label: str,
    default_is_error: ErrorCode,
    default_timeout_s: float,
    default_max_result_bytes: int,
) -> McpToolSpec:
    name = entry.name if entry.name is not None else upstream
    if not TOOL_NAME.fullmatch(name):
        raise McpConfigError(
            f"{label}: name {name!r} must be 1-64 letters, digits, '_' or '-'"
            + ("" if entry.name is not None else " (set `name` to the name the model sees)")
        )
    if not PERMISSION.fullmatch(entry.permission):
        raise McpConfigError(f"{label}: permission must be 1-128 characters without spaces, e.g. \"notes:read\"")
    timeout_s = entry.timeout_s if entry.timeout_s is not None else default_timeout_s
    if not 0 < timeout_s <= 3600:
        raise McpConfigError(f"{label}: timeout_s must be more than 0 and at most 3600")
    max_result_bytes = entry.max_result_bytes if entry.max_result_bytes is not None else default_max_result_bytes
    if max_result_bytes < 1:
        raise McpConfigError(f"{label}: max_result_bytes must be at least 1")
    return McpToolSpec(
        upstream_name=upstream,
        name=name,
        permission=entry.permission,
        mutates=entry.mutates,
        timeout_s=float(timeout_s),
        max_result_bytes=max_result_bytes,
        sensitive_fields=frozenset(entry.sensitive_fields),
        is_error_code=ErrorCode(entry.is_error_code) if entry.is_error_code is not None else default_is_error,
    )


def convert(raw: Any, kind: type[Any], label: str) -> Any:
    """``raw`` as ``kind``, strictly; an unknown key or a wrong type is refused naming the key."""
    if not isinstance(raw, dict):
        raise McpConfigError(f"{label}: must be a table (a mapping of keys to values)")
    try:
        return msgspec.convert(raw, kind, strict=True)
    except msgspec.ValidationError as exc:
        detail, _, at = str(exc).partition(" - at `$")
        field = at.rstrip("`").lstrip(".")
        raise McpConfigError(f"{label}: {field + ': ' if field else ''}{detail[:1].lower() + detail[1:]}") from None


def longest_timeout_s(servers: Iterable[McpServerSpec], default: float) -> float:
    return max((tool.timeout_s for server in servers for tool in server.tools), default=default)
