"""The hot path's SQL lives in files (``gateway/db/sql/``); audit rows have one writer; the
ledger decides at the caller's clock.

- ``gateway_append_audit(jsonb)``: the one statement the hot path writes audit rows with,
  keyed by the fields of ``gateway.audit.rows.AuditRow``.
- ``gateway_admit_calls(jsonb, jsonb)`` replaces ``gateway_admit_calls(timestamptz, jsonb,
  jsonb, timestamptz)``: each batch carries its own time (the ``now`` its request was given)
  and stale-call cut-off, instead of one clock for the whole statement; its audit rows go
  through ``gateway_append_audit``.
- ``gateway_record_calls(jsonb)`` replaces ``gateway_record_calls(timestamptz, jsonb)`` the
  same way.
- ``gateway_take_tokens`` is applied from its file (unchanged).

A later change to one of these functions edits its file and applies it in a new revision.
Downgrading restores the functions of 0006 (``gateway_take_tokens`` is the same in both).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

from gateway.db.sqlfiles import apply_sql_file

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DROP FUNCTION gateway_admit_calls(timestamptz, jsonb, jsonb, timestamptz)")
    op.execute("DROP FUNCTION gateway_record_calls(timestamptz, jsonb)")
    apply_sql_file("append_audit.sql")
    apply_sql_file("admit_calls.sql")
    apply_sql_file("record_calls.sql")
    apply_sql_file("take_tokens.sql")


def _revision(filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"gateway_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    op.execute("DROP FUNCTION gateway_record_calls(jsonb)")
    op.execute("DROP FUNCTION gateway_admit_calls(jsonb, jsonb)")
    op.execute("DROP FUNCTION gateway_append_audit(jsonb)")
    op.execute(_revision("0006_frozen_arguments_and_call_identity.py").ADMIT_CALLS)
    op.execute(_revision("0002_hot_path_functions.py").RECORD_CALLS)
