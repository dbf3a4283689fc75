"""Ids in paths are checked before any query: an id that cannot exist (NUL, odd characters,
too long) is 400, never a database error (PostgreSQL text cannot even hold NUL)."""

from __future__ import annotations

import pytest

from tests.support.calls import batch, tool_call
from tests.support.http import assert_error
from tests.support.tokens import auth_for

CAROL = auth_for("carol")
# "run%0A": a final newline, which a pattern ending in `$` would let through in Python.
BAD_IDS = ["run%00x", "x" * 65, "run%20x", "r%C3%A9n", "run%0A", "run%0D%0A"]


@pytest.mark.parametrize("run_id", BAD_IDS)
async def test_a_malformed_run_id_is_invalid_request(client, run_id):
    assert_error(await client.get(f"/v1/runs/{run_id}", headers=CAROL), 400, "INVALID_REQUEST")


@pytest.mark.parametrize("run_id", BAD_IDS)
async def test_tool_calls_on_a_malformed_run_id_are_invalid_request(client, run_id):
    body = batch(tool_call("add", {"a": 1, "b": 2}, call_id="c1"))
    response = await client.post(f"/v1/runs/{run_id}/tool-calls", json=body, headers=CAROL)
    assert_error(response, 400, "INVALID_REQUEST")


@pytest.mark.parametrize("approval_id", BAD_IDS)
async def test_a_malformed_approval_id_is_invalid_request(client, approval_id):
    assert_error(await client.get(f"/v1/approvals/{approval_id}", headers=CAROL), 400, "INVALID_REQUEST")
    response = await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=CAROL)
    assert_error(response, 400, "INVALID_REQUEST")
    response = await client.post(f"/v1/admin/approvals/{approval_id}/reject", json={"reason": "no"}, headers=CAROL)
    assert_error(response, 400, "INVALID_REQUEST")


async def test_a_well_formed_unknown_id_is_not_found(client):
    assert_error(await client.get("/v1/runs/run_0123456789abcdef", headers=CAROL), 404, "NOT_FOUND")
    assert_error(await client.get("/v1/approvals/apr_0123456789abcdef", headers=CAROL), 404, "NOT_FOUND")


@pytest.mark.parametrize("path", ["/healthz%0A", "/v1/admin/roles/editor%0A", "/v1/tools%7F", "/v1/runs/r%E2%80%A8"])
async def test_a_path_holding_an_unprintable_character_is_invalid_request_on_any_route(client, path):
    # Python's `$` in the parameter patterns also matches before a final newline.
    assert_error(await client.get(path, headers=CAROL), 400, "INVALID_REQUEST")
