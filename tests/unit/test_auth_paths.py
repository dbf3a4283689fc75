"""The routes left public are matched whole: Litestar matches exclude patterns anywhere in
the path, so an unanchored "/healthz" would also unprotect "/v1/anything/healthz"."""

from __future__ import annotations

import pytest
from litestar.middleware._utils import build_exclude_path_pattern

from gateway.auth.middleware import PUBLIC_PATHS

PATTERN = build_exclude_path_pattern(exclude=PUBLIC_PATHS)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/schema", "/schema/openapi.json", "/schema/swagger"])
def test_public_paths_are_public(path):
    assert PATTERN.search(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/anything/healthz",
        "/v1/runs/healthz",
        "/healthz/x",
        "/v1/healthz",
        "/v1/runs/readyz",
        "/v1/schema",
        "/v1/runs/schema/openapi.json",
        "/schemas",
        "/v1/tools",
    ],
)
def test_paths_that_merely_contain_a_public_path_are_protected(path):
    assert not PATTERN.search(path)
