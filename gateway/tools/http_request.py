"""Building the request of an HTTP tool from its declaration and the call's arguments.

Nothing the model sends can choose where a request goes. The scheme, host and port come
only from a service's base URL, parsed and checked at start; the URL is assembled from
those parts, never parsed from a string that contains arguments:

- path parameters fill whole values inside path segments and are percent-encoded with
  nothing left "safe" (``/``, ``?``, ``#``, ``%``, ``@``, ``:``, CR/LF and all non-ASCII are
  encoded), and a value that would make a segment empty, ``.`` or ``..`` is refused;
- query parameters are percent-encoded the same way;
- body fields travel as JSON;
- arguments never become headers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import msgspec

from gateway.tools.base import ArgumentsInvalid

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_METHODS_WITHOUT_BODY = frozenset({"GET", "DELETE"})
# RFC 3986 pchar without "%": literal text of a base path or a path template.
_LITERAL = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,;=:@]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9\-.]*[A-Za-z0-9])?$")
_SCALARS = frozenset({"string", "integer", "number", "boolean", "null"})
_PATH_TYPES = frozenset({"string", "integer"})
_encode_json = msgspec.json.Encoder().encode


class RequestTemplateError(ValueError):
    """A base URL or a request declaration is not acceptable; the message says why."""


@dataclass(frozen=True, slots=True)
class ServiceEndpoint:
    """A business service the gateway may call: the only place a host and port come from."""

    name: str
    scheme: str
    host: str
    port: int | None
    base_path: str
    """Literal, without a trailing slash (``""`` for the root)."""
    audience: str

    @classmethod
    def parse(cls, name: str, base_url: str, *, audience: str | None = None) -> ServiceEndpoint:
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https"):
            raise RequestTemplateError(f"base URL {base_url!r} must start with http:// or https://")
        if parts.username is not None or parts.password is not None or "@" in parts.netloc:
            raise RequestTemplateError(f"base URL {base_url!r} must not carry credentials")
        if parts.query or parts.fragment or "?" in base_url or "#" in base_url:
            raise RequestTemplateError(f"base URL {base_url!r} must not have a query or a fragment")
        host = parts.hostname or ""
        if not _HOST.fullmatch(host):
            raise RequestTemplateError(f"base URL {base_url!r} must name a host (letters, digits, '-' and '.')")
        try:
            port = parts.port
        except ValueError:
            raise RequestTemplateError(f"base URL {base_url!r} has an invalid port") from None
        if port == _DEFAULT_PORTS[parts.scheme]:
            port = None  # as httpx writes it: "http://host:80" is "http://host"
        base_path = parts.path.rstrip("/")
        _check_literal_path(base_path, f"base URL {base_url!r}")
        return cls(name=name, scheme=parts.scheme, host=host.lower(), port=port, base_path=base_path,
                   audience=audience or name)

    def url(self, raw_path: str, raw_query: str) -> httpx.URL:
        url = httpx.URL(
            scheme=self.scheme, host=self.host, port=self.port, raw_path=self.request_target(raw_path, raw_query)
        )
        # Holds by construction; checked anyway, because a wrong host here is the one mistake
        # this module exists to make impossible.
        if url.scheme != self.scheme or url.host != self.host or url.port != self.port:
            raise RuntimeError("built a URL outside its service")
        return url

    @property
    def connect_port(self) -> int:
        """The port connections go to (the scheme's when the base URL names none)."""
        return self.port if self.port is not None else _DEFAULT_PORTS[self.scheme]

    @property
    def host_header(self) -> bytes:
        """The ``Host`` header of a request to this service (the port when not the scheme's)."""
        default = self.port is None or self.port == _DEFAULT_PORTS[self.scheme]
        return (self.host if default else f"{self.host}:{self.port}").encode("ascii")

    def request_target(self, raw_path: str, raw_query: str) -> bytes:
        """``url``'s request target, as the connection pool sends it to this service's own
        scheme, host and ``connect_port``: only a path and a query (it starts with '/')."""
        return (self.base_path + raw_path + (f"?{raw_query}" if raw_query else "")).encode("ascii")


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _check_literal_path(path: str, what: str) -> None:
    if path and not path.startswith("/"):
        raise RequestTemplateError(f"{what}: the path must start with '/'")
    for segment in path.split("/")[1:]:
        if not _LITERAL.fullmatch(segment):
            raise RequestTemplateError(
                f"{what}: path segment {segment!r} may only use letters, digits and -._~!$&'()*+,;=:@"
            )
        if segment in (".", ".."):
            raise RequestTemplateError(f"{what}: the path must not contain '.' or '..' segments")


@dataclass(frozen=True, slots=True)
class _Segment:
    parts: tuple[str | tuple[str], ...]
    """Literal strings, and ``(name,)`` for a placeholder."""


@dataclass(frozen=True, slots=True)
class RequestTemplate:
    method: str
    path_template: str
    segments: tuple[_Segment, ...]
    trailing_slash: bool
    path_params: tuple[str, ...]
    query: tuple[str, ...]
    body: tuple[str, ...]

    @classmethod
    def compile(
        cls,
        *,
        method: str,
        path: str,
        query: Sequence[str],
        body: Sequence[str],
        schema: Mapping[str, Any],
    ) -> RequestTemplate:
        """Check the declaration against the (strict) argument schema: every argument goes to
        exactly one place, path parameters are required strings or integers, query parameters
        are scalars or lists of scalars."""
        method = method.upper()
        if method not in METHODS:
            raise RequestTemplateError(f"method must be one of {', '.join(METHODS)}")
        if not path.startswith("/"):
            raise RequestTemplateError(f"path {path!r} must start with '/'")
        if "?" in path or "#" in path:
            raise RequestTemplateError(f"path {path!r} must not contain '?' or '#': declare query parameters")
        properties: Mapping[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", ()))
        raw_segments = path.split("/")[1:] if path != "/" else []
        trailing_slash = len(raw_segments) > 1 and raw_segments[-1] == ""
        if trailing_slash:
            raw_segments = raw_segments[:-1]
        segments: list[_Segment] = []
        path_params: list[str] = []
        for raw in raw_segments:
            parts: list[str | tuple[str]] = []
            position = 0
            for match in _PLACEHOLDER.finditer(raw):
                parts.append(raw[position:match.start()])
                parts.append((match.group(1),))
                path_params.append(match.group(1))
                position = match.end()
            parts.append(raw[position:])
            literals = [p for p in parts if isinstance(p, str)]
            for literal in literals:
                if not _LITERAL.fullmatch(literal):
                    raise RequestTemplateError(
                        f"path {path!r}: {literal!r} may only use letters, digits, -._~!$&'()*+,;=:@ "
                        "and {name} placeholders"
                    )
            if len(literals) == len(parts):
                if raw in ("", ".", ".."):
                    raise RequestTemplateError(f"path {path!r} must not contain empty, '.' or '..' segments")
            segments.append(_Segment(tuple(p for p in parts if p != "")))
        for name in path_params:
            if path_params.count(name) > 1:
                raise RequestTemplateError(f"path parameter {{{name}}} appears twice")
            prop = properties.get(name)
            if prop is None:
                raise RequestTemplateError(f"path parameter {{{name}}} is not one of the argument schema's properties")
            if name not in required:
                raise RequestTemplateError(f"path parameter {{{name}}} must be listed in the schema's required")
            types = _declared_types(prop)
            if not types or not types <= _PATH_TYPES:
                raise RequestTemplateError(f'path parameter {{{name}}} must have "type": "string" or "integer"')
        for name in query:
            prop = properties.get(name)
            if prop is None:
                raise RequestTemplateError(f"query parameter {name!r} is not one of the argument schema's properties")
            if not _is_query_type(prop):
                raise RequestTemplateError(
                    f"query parameter {name!r} must be declared with a scalar \"type\" "
                    "(string, integer, number, boolean) or an array of those"
                )
        for name in body:
            if name not in properties:
                raise RequestTemplateError(f"body field {name!r} is not one of the argument schema's properties")
        if body and method in _METHODS_WITHOUT_BODY:
            raise RequestTemplateError(f"a {method} request has no body: send {', '.join(body)} in the query or path")
        placed = [*path_params, *query, *body]
        for name in placed:
            if placed.count(name) > 1:
                raise RequestTemplateError(f"argument {name!r} is sent in more than one place")
        unplaced = [name for name in properties if name not in placed]
        if unplaced:
            raise RequestTemplateError(
                f"argument {unplaced[0]!r} is sent nowhere: put it in the path, request.query or request.body"
            )
        return cls(
            method=method,
            path_template=path,
            segments=tuple(segments),
            trailing_slash=trailing_slash,
            path_params=tuple(path_params),
            query=tuple(query),
            body=tuple(body),
        )

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Refuse path values that would empty a segment or make it '.' or '..' (``ArgumentsInvalid``)."""
        self.raw_path(arguments)

    def raw_path(self, arguments: Mapping[str, Any]) -> str:
        out = []
        for segment in self.segments:
            text = "".join(
                part if isinstance(part, str) else quote(_path_value(arguments[part[0]]), safe="")
                for part in segment.parts
            )
            if text in ("", ".", ".."):
                names = [f"`{part[0]}`" for part in segment.parts if not isinstance(part, str)]
                raise ArgumentsInvalid(f"{' and '.join(names)} must not be empty, '.' or '..'.")
            out.append(text)
        return "/" + "/".join(out) + ("/" if self.trailing_slash else "") if out else "/"

    def raw_query(self, arguments: Mapping[str, Any]) -> str:
        pairs = []
        for name in self.query:
            value = arguments.get(name)
            if value is None:
                continue
            for item in value if isinstance(value, list) else (value,):
                if item is None:
                    continue
                pairs.append(f"{quote(name, safe='')}={quote(_query_value(item), safe='')}")
        return "&".join(pairs)

    def json_body(self, arguments: Mapping[str, Any]) -> bytes | None:
        if not self.body:
            return None
        return _encode_json({name: arguments[name] for name in self.body if name in arguments})

    def build(self, service: ServiceEndpoint, arguments: Mapping[str, Any]) -> tuple[httpx.URL, bytes | None]:
        return service.url(self.raw_path(arguments), self.raw_query(arguments)), self.json_body(arguments)

    def build_request_target(
        self, service: ServiceEndpoint, arguments: Mapping[str, Any]
    ) -> tuple[bytes, bytes | None]:
        """``build`` for the connection pool: the request target (``ServiceEndpoint.request_target``)
        and the body."""
        return service.request_target(self.raw_path(arguments), self.raw_query(arguments)), self.json_body(arguments)


def _path_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        # The schema allows only strings and integers here; anything else is a bug upstream.
        raise ArgumentsInvalid("A path parameter must be a string or an integer.")
    return str(value)


def _query_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return _encode_json(value).decode()
    raise ArgumentsInvalid("A query parameter must be a string, a number or a boolean.")


def _declared_types(prop: Any) -> frozenset[str]:
    if not isinstance(prop, Mapping) or "type" not in prop:
        return frozenset()
    types = prop["type"]
    return frozenset(types) if isinstance(types, list) else frozenset({types})


def _is_query_type(prop: Any) -> bool:
    types = _declared_types(prop)
    if not types:
        return False
    if types <= _SCALARS:
        return True
    if types <= _SCALARS | {"array"}:
        items = prop.get("items")
        return isinstance(items, Mapping) and bool(_declared_types(items)) and _declared_types(items) <= _SCALARS
    return False
