"""Migration 0013 on a database that already holds audit rows, sealed and not, in several
months: the rows move into monthly partitions with their ids, the sealed ones' chain columns
become their links, the chain verifies across the months and the sealer goes on where it
was; the migration downgrades to the old shape (chains intact) and upgrades again.
PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import command

from gateway.audit.chain import content_hash, genesis_hash, link_hash
from gateway.audit.rows import AuditRow, append_audit
from gateway.audit.sealer import AuditSealer
from gateway.audit.verify import verify_chain
from gateway.db.migrate import alembic_config, check_models_match
from tests.support import db
from tests.support.db import months_ago


class _Row:
    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def _legacy_rows() -> tuple[list[dict[str, Any]], dict[str, tuple[int, str]]]:
    """Rows of the 0012 shape: acme's first five sealed (in three months), two not sealed yet;
    globex's one row sealed."""
    times = [months_ago(3), months_ago(3, day=20), months_ago(2), months_ago(1), months_ago(1, day=9),
             months_ago(1, day=10), months_ago(0, day=1), months_ago(2, day=5)]
    rows, heads = [], {}
    prev = {"acme": genesis_hash("acme"), "globex": genesis_hash("globex")}
    seqs = {"acme": 0, "globex": 0}
    for n, created_at in enumerate(times, start=1):
        tenant = "globex" if n == 8 else "acme"
        row = {
            "id": n, "tenant_id": tenant, "kind": "tool_call", "user_id": "bob", "run_id": "run_1",
            "tool_call_id": f"c{n}", "tool": "add", "arguments": {"a": n}, "arguments_sha256": "0" * 64,
            "outcome": "OK", "duration_ms": 1.5, "approval_id": None, "request_id": f"req_{n}", "error_id": None,
            "detail": None, "created_at": created_at,
            "chain_seq": None, "content_hash": None, "prev_hash": None, "chain_hash": None,
        }
        if n not in (6, 7):
            seqs[tenant] += 1
            content = content_hash(_Row(row))
            link = link_hash(seqs[tenant], prev[tenant], content, created_at, version=1)  # sealed before 0022
            row.update(chain_seq=seqs[tenant], content_hash=content, prev_hash=prev[tenant], chain_hash=link)
            prev[tenant] = link
            heads[tenant] = (seqs[tenant], link)
        rows.append(row)
    return rows, heads


async def _seed_legacy(url: str) -> None:
    rows, heads = _legacy_rows()
    legacy = sa.table("audit_events", *(sa.column(name) for name in rows[0]))
    chains = sa.table(
        "audit_chains", *(sa.column(c) for c in ("tenant_id", "head_seq", "head_hash", "anchor_seq", "anchor_hash",
                                                 "pruned_rows", "updated_at"))
    )
    async with db.open_database(url) as database, database.begin() as conn:
        for row in rows:
            values = {**row, "arguments": sa.cast(sa.literal(f'{{"a": {row["id"]}}}'), sa.dialects.postgresql.JSONB)}
            await conn.execute(sa.insert(legacy).values(**values))
        await conn.execute(sa.text("SELECT setval(pg_get_serial_sequence('audit_events', 'id'), 8)"))
        for tenant, (seq, link) in heads.items():
            await conn.execute(sa.insert(chains).values(
                tenant_id=tenant, head_seq=seq, head_hash=link, anchor_seq=0, anchor_hash=genesis_hash(tenant),
                pruned_rows=0, updated_at=datetime.now(months_ago(0).tzinfo),
            ))


async def _verify(url: str, tenant: str) -> Any:
    async with db.open_database(url) as database, database.connect() as conn:
        return await verify_chain(conn, tenant_id=tenant)


async def test_upgrading_partitions_the_rows_and_keeps_the_chains(pg_url):
    config = alembic_config(pg_url)
    await asyncio.to_thread(command.downgrade, config, "0012")
    await _seed_legacy(pg_url)

    await asyncio.to_thread(command.upgrade, config, "head")
    await asyncio.to_thread(check_models_match, pg_url)

    acme, globex = await _verify(pg_url, "acme"), await _verify(pg_url, "globex")
    assert (acme.ok, acme.verified_rows, acme.unsealed_rows, acme.head_seq) == (True, 5, 2, 5)
    assert (globex.ok, globex.verified_rows, globex.unsealed_rows) == (True, 1, 0)
    placed = dict(await db.rows(pg_url, sa.text("SELECT id, tableoid::regclass::text FROM audit_events")))
    assert placed[1] == f"audit_events_p{months_ago(3):%Y_%m}"
    assert placed[3] == f"audit_events_p{months_ago(2):%Y_%m}"
    assert placed[4] == f"audit_events_p{months_ago(1):%Y_%m}"
    assert "audit_events_default" not in placed.values()

    async with db.open_database(pg_url) as database:
        async with database.begin() as conn:
            await append_audit(conn, AuditRow(tenant_id="acme", kind="tool_call", outcome="OK",
                                              created_at=months_ago(0, day=1)))
        assert await AuditSealer(database).seal_pending() == 3
    acme = await _verify(pg_url, "acme")
    assert (acme.ok, acme.verified_rows, acme.unsealed_rows) == (True, 8, 0)
    order = [r.audit_id for r in await db.rows(
        pg_url, sa.text("SELECT audit_id FROM audit_links WHERE tenant_id = 'acme' ORDER BY chain_seq"))]
    assert order == [1, 2, 3, 4, 5, 6, 7, 9]  # the old unsealed rows first, in id order; the id sequence went on


async def test_downgrading_restores_one_table_with_its_chain_columns_and_upgrading_again_verifies(pg_url):
    config = alembic_config(pg_url)
    await asyncio.to_thread(command.downgrade, config, "0012")
    await _seed_legacy(pg_url)
    await asyncio.to_thread(command.upgrade, config, "head")
    async with db.open_database(pg_url) as database:
        assert await AuditSealer(database).seal_pending() == 2
        # Below 0022 no release reads version-2 links (its downgrade refuses them,
        # test_migration_0022): sealed as the releases between 0013 and 0022 sealed.
        await db.relink_as_version_1(database)

    await asyncio.to_thread(command.downgrade, config, "0012")

    old = {r.id: r for r in await db.rows(pg_url, sa.text("SELECT * FROM audit_events ORDER BY id"))}
    assert sorted(old) == list(range(1, 9))
    assert [old[i].chain_seq for i in range(1, 8)] == [1, 2, 3, 4, 5, 6, 7]  # sealed after 0013 too
    kinds = await db.rows(pg_url, sa.text(
        "SELECT relkind::text AS relkind FROM pg_class WHERE relname = 'audit_events' OR relname LIKE 'audit_events_p%'"))
    assert [k.relkind for k in kinds] == ["r"]
    assert await db.rows(pg_url, sa.text("SELECT to_regclass('audit_links') AS t")) == [(None,)]
    new_id = await db.rows(pg_url, sa.text(
        "INSERT INTO audit_events (tenant_id, kind, outcome, created_at) VALUES ('acme', 'x', 'OK', now()) RETURNING id"))
    assert new_id == [(9,)]
    refused = await db.rows(pg_url, sa.text("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'audit_events_append_only%'"))
    assert refused == [(2,)]

    await asyncio.to_thread(command.upgrade, config, "head")
    acme = await _verify(pg_url, "acme")
    assert (acme.ok, acme.verified_rows, acme.unsealed_rows) == (True, 7, 0)
