"""Driving approvals as a model and an administrator would."""

from __future__ import annotations

from typing import Any

from litestar.testing import AsyncTestClient

from tests.support.calls import send_one
from tests.support.tokens import auth_for

CAROL = auth_for("carol")


async def request_approval(
    client: AsyncTestClient, run_id: str, headers: dict[str, str], call_id: str, tool: str, arguments: dict[str, Any]
) -> str:
    content = await send_one(client, run_id, headers, call_id, tool, arguments)
    assert content["ok"] is False and content["error"]["code"] == "APPROVAL_REQUIRED", content
    return content["error"]["approval_id"]


async def approve(client: AsyncTestClient, approval_id: str, headers: dict[str, str] = CAROL) -> Any:
    return await client.post(f"/v1/admin/approvals/{approval_id}/approve", headers=headers)


async def reject(client: AsyncTestClient, approval_id: str, reason: str, headers: dict[str, str] = CAROL) -> Any:
    return await client.post(f"/v1/admin/approvals/{approval_id}/reject", json={"reason": reason}, headers=headers)
