"""Assertions on the HTTP error envelope."""

from __future__ import annotations

from typing import Any


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The one envelope: ``{"error": {"code", "message", "request_id"}}``, request id echoed in the header."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["request_id"] and error["request_id"] == response.headers["x-request-id"]
    assert set(error) <= {"code", "message", "request_id", "error_id"}
    return error
