"""What a delivery carries: the event's body (Standard Webhooks or Slack), and its signature.

The Standard Webhooks conventions (https://www.standardwebhooks.com): the headers
``webhook-id`` (the delivery's id, the same on every attempt), ``webhook-timestamp`` (Unix
seconds of this attempt) and ``webhook-signature`` (``v1,`` and the base64 HMAC-SHA256 of
``id.timestamp.body`` keyed with the secret's bytes: the base64 after ``whsec_``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any, Literal

import msgspec

EVENT_TYPES = ("approval.created", "approval.decided", "approval.expired", "run.stopped")
EventType = Literal["approval.created", "approval.decided", "approval.expired", "run.stopped"]
Format = Literal["standard", "slack"]

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header's value."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def console_url(base_url: str, approval_id: str) -> str:
    return f"{base_url.rstrip('/')}/console/approvals/{approval_id}"


def event_data(event_type: str, data: dict[str, Any], *, base_url: str) -> dict[str, Any]:
    """The stored event data, with the console link of the approval it is about."""
    if event_type.startswith("approval.") and isinstance(data.get("approval_id"), str):
        return {**data, "console_url": console_url(base_url, data["approval_id"])}
    return dict(data)


def standard_body(event_type: str, timestamp: str, data: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"type": event_type, "timestamp": timestamp, "data": data})


_SLACK_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def _slack(value: Any) -> str:
    """A value shown in Slack's ``mrkdwn``: its control characters escaped, so a tool or user
    name cannot make a link or a mention."""
    return str(value).translate(_SLACK_ESCAPES)


def slack_body(event_type: str, data: dict[str, Any]) -> bytes:
    """A Slack incoming-webhook message: ``{"text": ...}`` with the console link."""
    if event_type == "run.stopped":
        text = (f"Agent run {_slack(data.get('run_id'))} of {_slack(data.get('user_id'))} "
                f"{_slack(data.get('state'))}: {_slack(data.get('stop_reason'))}")
    else:
        what = {
            "approval.created": "Approval requested",
            "approval.decided": f"Approval {_slack(data.get('decision') or 'decided')}",
            "approval.expired": "Approval expired",
        }.get(event_type, _slack(event_type))
        text = f"{what}: `{_slack(data.get('tool'))}` requested by {_slack(data.get('requester_id'))}"
        if data.get("decided_by"):
            text += f", decided by {_slack(data['decided_by'])}"
        if data.get("console_url"):
            text += f" <{_slack(data['console_url'])}|Open in the console>"
    return msgspec.json.encode({"text": text})
