"""Lookups of one run or approval by id name its primary key ``(tenant_id, id)`` (migration
0020); the user who must own a run is compared in a form no index serves, so that no plan
reads a run through ``(tenant_id, user_id, created_at)`` (migration 0017)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from gateway.db.approvals import approvals, the_approval
from gateway.db.runs import runs, the_run, the_tenants_run


def sql(table: sa.Table, condition: sa.ColumnElement[bool]) -> str:
    statement = sa.select(table.c.id).where(condition)
    return str(statement.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))


def test_a_run_of_a_user_is_found_by_its_key_and_owned_through_a_filter():
    text = sql(runs, the_run("run_1", tenant_id="acme", user_id="alice"))
    assert "runs.tenant_id = 'acme'" in text and "runs.id = 'run_1'" in text
    assert "runs.user_id IS NOT DISTINCT FROM 'alice'" in text
    assert "runs.user_id =" not in text


def test_a_run_of_a_tenant_is_found_by_its_key():
    text = sql(runs, the_tenants_run("run_1", tenant_id="acme"))
    assert "runs.tenant_id = 'acme'" in text and "runs.id = 'run_1'" in text
    assert "user_id" not in text.split("WHERE", 1)[1]


def test_an_approval_is_found_by_its_key():
    text = sql(approvals, the_approval("apr_1", tenant_id="acme"))
    assert "approvals.tenant_id = 'acme'" in text and "approvals.id = 'apr_1'" in text
