"""An audit row's columns are written in one shape: ``AuditRow``, the table, and the column
list of the hot path's SQL writer agree."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from gateway.audit.chain import CANONICAL_FIELDS, WRITE_ORDER_FIELDS
from gateway.audit.rows import AUDIT_ROW_FIELDS, audit_json
from gateway.db.models import AuditEvent
from gateway.db.sqlfiles import read_sql


def test_an_audit_row_has_every_column_but_the_id_and_the_transaction_id():
    columns = set(AuditEvent.__table__.columns.keys())
    assert set(AUDIT_ROW_FIELDS) == columns - {"id", *WRITE_ORDER_FIELDS}
    assert set(AUDIT_ROW_FIELDS) == set(CANONICAL_FIELDS) - {"id"}


def test_the_sql_writer_inserts_exactly_the_audit_row_fields_in_their_order():
    sql = read_sql("append_audit.sql")
    inserted = re.search(r"INSERT INTO audit_events \(([^)]*)\)", sql)
    selected = re.search(r"SELECT (r\..*?)\s+FROM", sql, re.S)
    assert inserted is not None and selected is not None
    assert tuple(c.strip() for c in inserted.group(1).split(",")) == AUDIT_ROW_FIELDS
    assert tuple(c.strip().removeprefix("r.") for c in selected.group(1).split(",")) == AUDIT_ROW_FIELDS


def test_a_part_of_an_audit_row_refuses_a_name_that_is_not_a_column():
    assert audit_json(tool="add", created_at=datetime(2030, 1, 1, tzinfo=UTC)) == {
        "tool": "add",
        "created_at": "2030-01-01T00:00:00+00:00",
    }
    with pytest.raises(TypeError, match="args_sha256"):
        audit_json(args_sha256="x")


def test_the_sql_files_are_read_as_package_resources():
    assert "CREATE OR REPLACE FUNCTION gateway_admit_calls" in read_sql("admit_calls.sql")
