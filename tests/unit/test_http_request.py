"""Requests of HTTP tools are built from parsed parts: no argument can leave the service."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tools.base import ArgumentsInvalid
from gateway.tools.http_request import RequestTemplate, RequestTemplateError, ServiceEndpoint
from gateway.tools.json_arguments import strict_schema

SERVICE = ServiceEndpoint.parse("orders", "http://orders.internal:8080/api/v1")


def schema(**properties: Any) -> dict[str, Any]:
    return strict_schema({"type": "object", "required": list(properties), "properties": properties})


ITEM = RequestTemplate.compile(
    method="GET",
    path="/items/{item_id}/parts/{part}.json",
    query=["q", "tags"],
    body=[],
    schema=strict_schema(
        {
            "type": "object",
            "required": ["item_id", "part"],
            "properties": {
                "item_id": {"type": "string"},
                "part": {"type": "integer"},
                "q": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        }
    ),
)


@pytest.mark.parametrize(
    ("base_url", "why"),
    [
        ("ftp://orders.internal/api", "http"),
        ("orders.internal/api", "http"),
        ("http://user:secret@orders.internal/api", "credentials"),
        ("http://@orders.internal/api", "credentials"),
        ("http://orders.internal/api?x=1", "query"),
        ("http://orders.internal/api#top", "fragment"),
        ("http:///api", "host"),
        ("http://orders internal/api", "host"),
        ("http://orders.internal:99999/api", "port"),
        ("http://orders.internal/a/../admin", "'..'"),
        ("http://orders.internal/a%2F..", "path segment"),
    ],
)
def test_base_urls_that_could_hide_another_target_are_refused(base_url: str, why: str):
    with pytest.raises(RequestTemplateError, match=why):
        ServiceEndpoint.parse("orders", base_url)


def test_base_url_parts_are_kept_apart():
    service = ServiceEndpoint.parse("orders", "https://Orders.Internal:8443/api/")
    assert (service.scheme, service.host, service.port, service.base_path) == ("https", "orders.internal", 8443, "/api")
    assert service.audience == "orders"


@pytest.mark.parametrize(
    ("declaration", "why"),
    [
        ({"method": "TRACE", "path": "/x"}, "method"),
        ({"method": "GET", "path": "x"}, "start with '/'"),
        ({"method": "GET", "path": "/x?y=1"}, "'\\?'"),
        ({"method": "GET", "path": "/a/../b"}, "'..'"),
        ({"method": "GET", "path": "/a//b"}, "empty"),
        ({"method": "GET", "path": "/a%2Fb"}, "may only use"),
        ({"method": "GET", "path": "/items/{id}/x\n"}, "may only use"),
        ({"method": "GET", "path": "/items\n"}, "may only use"),
        ({"method": "GET", "path": "/items/{nope}"}, "not one of the argument schema's properties"),
        ({"method": "GET", "path": "/items/{id}/{id}"}, "twice"),
        ({"method": "GET", "path": "/items", "body": ["id"]}, "has no body"),
        ({"method": "GET", "path": "/items"}, "sent nowhere"),
        ({"method": "POST", "path": "/items/{id}", "body": ["id"]}, "more than one place"),
        ({"method": "GET", "path": "/items", "query": ["filters"], "extra": True}, "scalar"),
    ],
)
def test_request_declarations_are_checked_against_the_schema(declaration: dict[str, Any], why: str):
    properties: dict[str, Any] = {"id": {"type": "string"}}
    if declaration.pop("extra", False):
        properties = {"id": {"type": "string"}, "filters": {"type": "object", "properties": {}}}
        declaration.setdefault("body", [])
        declaration["query"] = ["filters", "id"]
    with pytest.raises(RequestTemplateError, match=why):
        RequestTemplate.compile(
            method=declaration["method"],
            path=declaration["path"],
            query=declaration.get("query", []),
            body=declaration.get("body", []),
            schema=schema(**properties),
        )


def test_path_parameters_must_be_required_strings_or_integers():
    optional = strict_schema({"type": "object", "properties": {"id": {"type": "string"}}})
    with pytest.raises(RequestTemplateError, match="required"):
        RequestTemplate.compile(method="GET", path="/items/{id}", query=[], body=[], schema=optional)
    with pytest.raises(RequestTemplateError, match='"type": "string" or "integer"'):
        RequestTemplate.compile(method="GET", path="/items/{id}", query=[], body=[],
                                schema=schema(id={"type": "number"}))


def test_arguments_go_where_declared():
    template = RequestTemplate.compile(
        method="POST", path="/orders/{order_id}/lines", query=["dry_run"], body=["sku", "quantity"],
        schema=strict_schema({
            "type": "object",
            "required": ["order_id", "sku"],
            "properties": {
                "order_id": {"type": "string"}, "dry_run": {"type": "boolean"},
                "sku": {"type": "string"}, "quantity": {"type": "integer"},
            },
        }),
    )
    url, body = template.build(SERVICE, {"order_id": "o 1", "dry_run": True, "sku": "a/b"})
    assert str(url) == "http://orders.internal:8080/api/v1/orders/o%201/lines?dry_run=true"
    assert body == b'{"sku":"a/b"}'  # quantity left out: not given


def test_list_query_parameters_repeat_the_key():
    url, _ = ITEM.build(SERVICE, {"item_id": "i", "part": 2, "tags": ["a b", "c&d=e"]})
    assert url.raw_path == b"/api/v1/items/i/parts/2.json?tags=a%20b&tags=c%26d%3De"


@pytest.mark.parametrize("value", ["", ".", ".."])
def test_values_that_would_make_a_dot_or_empty_segment_are_refused(value: str):
    template = RequestTemplate.compile(method="GET", path="/items/{id}", query=[], body=[],
                                       schema=schema(id={"type": "string"}))
    with pytest.raises(ArgumentsInvalid, match="`id`"):
        template.build(SERVICE, {"id": value})


@settings(max_examples=400, deadline=None)
@given(item_id=st.text(), q=st.text(), part=st.integers())
def test_no_value_changes_scheme_host_port_or_path_shape(item_id: str, q: str, part: int):
    arguments = {"item_id": item_id, "part": part, "q": q}
    if item_id in ("", ".", ".."):
        with pytest.raises(ArgumentsInvalid):
            ITEM.build(SERVICE, arguments)
        with pytest.raises(ArgumentsInvalid):
            ITEM.build_request_target(SERVICE, arguments)
        return
    url, body = ITEM.build(SERVICE, arguments)
    # What the connection pool is given (HTTP tools): the same origin and the same target.
    target, _ = ITEM.build_request_target(SERVICE, arguments)
    assert target == url.raw_path
    assert (SERVICE.scheme, SERVICE.host, SERVICE.connect_port) == ("http", "orders.internal", 8080)
    assert (url.scheme, url.host, url.port) == ("http", "orders.internal", 8080)
    assert url.userinfo == b"" and url.fragment == ""
    path, _, query = url.raw_path.decode("ascii").partition("?")
    assert path == f"/api/v1/items/{quote(item_id, safe='')}/parts/{part}.json"
    assert path.count("/") == 6
    assert query == f"q={quote(q, safe='')}"
    assert all(0x21 <= ord(c) < 0x7F for c in str(url))  # no spaces, no CR/LF, nothing raw
    assert body is None


@settings(max_examples=200, deadline=None)
@given(value=st.sampled_from(["http://evil.example", "//evil.example", "evil.example:80", "@evil.example",
                              "\\\\evil.example", "..\\evil", "%2F%2Fevil.example"]) | st.text(min_size=1))
def test_absolute_urls_and_authorities_in_arguments_stay_inside_the_path(value: str):
    if value in (".", ".."):
        return
    url, _ = ITEM.build(SERVICE, {"item_id": value, "part": 1})
    assert url.host == "orders.internal" and url.port == 8080
    assert url.raw_path.startswith(b"/api/v1/items/")


@pytest.mark.parametrize(
    ("base_url", "host"),
    [("http://orders.internal:8080/api", b"orders.internal:8080"), ("http://orders.internal/api", b"orders.internal"),
     ("http://Orders.Internal:80", b"orders.internal"), ("https://orders.internal:443", b"orders.internal"),
     ("https://orders.internal:8443", b"orders.internal:8443")],
)
def test_the_host_header_names_the_service_and_its_port_unless_the_schemes(base_url: str, host: bytes):
    service = ServiceEndpoint.parse("orders", base_url)
    assert service.host_header == host == service.url("/", "").netloc
