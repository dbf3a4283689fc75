"""The audit hash chain: the canonical content of a row, and how rows link.

Defined here once, in Python, for the sealer and ``audit verify`` alike:

- ``content_hash`` = sha256 of the row's canonical content: a JSON object (sorted keys at
  every level, no whitespace, UTF-8, times as RFC 3339 in UTC) of every column that says
  what happened — id, tenant, kind, user, run, tool_call_id, tool, the (redacted)
  arguments and their sha256, outcome, duration, approval id, request id, error id,
  detail and time.
- ``chain_hash`` = sha256 of ``"2:<chain_seq>:<prev_hash>:<content_hash>:<created_at>"``
  (link-hash version 2: the row's time as RFC 3339 in UTC, the same time the link keeps);
  ``prev_hash`` of a row is the ``chain_hash`` of the row before it in its tenant's chain,
  and of the first row the tenant's genesis hash (or, after pruning, the stored anchor).
  Links sealed before migration 0022 are version 1, ``"<chain_seq>:<prev_hash>:<content_hash>"``:
  the same but for the time. The time matters once retention has dropped a row: its link is
  then all that is left, and its time is what says the row's month was dropped.

Changing any covered column changes the content hash; deleting, inserting or reordering
sealed rows breaks the link of the row after; cutting the tail is caught by the chain
head the sealer stores in ``audit_chains``. A sealed row's chain columns live in its link
(``audit_links``, one row per sealed audit row); the audit row itself is never changed.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec

from gateway.db.models import AuditEvent, AuditLink

audit_events = AuditEvent.__table__
audit_links = AuditLink.__table__

CANONICAL_FIELDS: tuple[str, ...] = (
    "id",
    "tenant_id",
    "kind",
    "user_id",
    "run_id",
    "tool_call_id",
    "tool",
    "arguments",
    "arguments_sha256",
    "outcome",
    "duration_ms",
    "approval_id",
    "request_id",
    "error_id",
    "detail",
    "created_at",
)
"""Every column of ``audit_events`` except ``txid`` (a test keeps this complete)."""

WRITE_ORDER_FIELDS: tuple[str, ...] = ("txid",)
"""The columns of ``audit_events`` that say when a row was written, not what happened: the
sealer's order, not hashed (a copy of the table may give its rows new ones)."""

CHAIN_FIELDS: tuple[str, ...] = ("chain_seq", "content_hash", "prev_hash", "chain_hash", "hash_version")
"""The chain's columns of a row's link (``audit_links``)."""

CANONICAL_COLUMNS = tuple(audit_events.c[name] for name in CANONICAL_FIELDS)


_encoder = msgspec.json.Encoder(order="sorted")


def canonical_content(row: Any) -> bytes:
    """The bytes a row's content hash covers; ``row`` is a result row, a driver's record (read
    by column name) or any object holding the ``CANONICAL_FIELDS``."""
    values = getattr(row, "_mapping", None)
    if values is None and isinstance(row, asyncpg.Record):
        values = row
    if values is not None:
        content = {name: values[name] for name in CANONICAL_FIELDS}
    else:
        content = {name: getattr(row, name) for name in CANONICAL_FIELDS}
    created_at = content["created_at"]
    if created_at.tzinfo is None:
        raise ValueError("an audit row's time must be in UTC")
    content["created_at"] = created_at.astimezone(UTC)
    return _encoder.encode(content)


def content_hash(row: Any) -> str:
    return hashlib.sha256(canonical_content(row)).hexdigest()


LINK_HASH_VERSION = 2
"""What the sealer writes (``audit_links.hash_version``)."""


def link_hash(chain_seq: int, prev_hash: str, content: str, created_at: datetime, version: int = LINK_HASH_VERSION) -> str:
    """A link's ``chain_hash``; ``created_at`` is its row's time (the link's ``created_at``)."""
    if version == 1:
        return hashlib.sha256(f"{chain_seq}:{prev_hash}:{content}".encode()).hexdigest()
    if version != 2:
        raise ValueError(f"unknown link-hash version {version}")
    if created_at.tzinfo is None:
        raise ValueError("an audit row's time must be in UTC")
    at = created_at.astimezone(UTC).isoformat()
    return hashlib.sha256(f"2:{chain_seq}:{prev_hash}:{content}:{at}".encode()).hexdigest()


def genesis_hash(tenant_id: str) -> str:
    """What the first row of a tenant's chain points back to."""
    return hashlib.sha256(f"gateway-audit-genesis:{tenant_id}".encode()).hexdigest()
