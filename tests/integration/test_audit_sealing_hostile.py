"""The audit chain against what a careless transaction or an attacker with the gateway's
database rights can do: every row ends up sealed or reported, one bad row never stops the
sealing of the others, and partition upkeep never holds up readers for long."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import gateway.audit.prune as prune_module
from gateway.audit.chain import audit_events, audit_links
from gateway.audit.queries import AuditFilters, select_rows
from gateway.audit.sealer import AuditSealer, audit_chains
from gateway.db.engine import Database
from tests.integration.test_audit_chain import _insert, _row, _tamper, _verify
from tests.support.db import months_ago

pytestmark = pytest.mark.postgres


async def seal(db: Database) -> int:
    return await AuditSealer(db).seal_pending()


async def unlinked_rows(db: Database) -> list[tuple[int, str]]:
    async with db.connect() as conn:
        linked = sa.exists().where(
            audit_links.c.tenant_id == audit_events.c.tenant_id,
            audit_links.c.audit_id == audit_events.c.id,
            audit_links.c.created_at == audit_events.c.created_at,
        )
        return [tuple(r) for r in (await conn.execute(sa.select(audit_events.c.id, audit_events.c.kind).where(~linked)))]


async def test_the_prunes_own_audit_rows_are_sealed_even_when_a_request_commits_between_its_batches(db, monkeypatch):
    await _insert(db, [_row(n=i, created_at=months_ago(5)) for i in range(4)])
    monkeypatch.setattr(prune_module, "SEAL_BATCH", 2)
    real_seal_batch, batches = prune_module.seal_batch, []

    async def a_request_commits_after_the_first_batch(conn, *, batch_size):
        sealed = await real_seal_batch(conn, batch_size=batch_size)
        batches.append(sealed)
        if len(batches) == 1:
            await _insert(db, [_row(n=99)])
        return sealed

    monkeypatch.setattr(prune_module, "seal_batch", a_request_commits_after_the_first_batch)
    assert (await prune_module.prune(db, older_than=timedelta(days=90))).months
    await seal(db)
    assert await unlinked_rows(db) == []
    assert (await _verify(db)).ok


async def test_a_row_written_behind_the_sealers_back_is_reported_by_verify(db):
    await _insert(db, [_row(n=i) for i in range(3)])
    await seal(db)
    await _insert(db, [_row(n=7, txid=3)])  # below the watermark: the sealer will never see it
    assert await seal(db) == 0
    report = await _verify(db)
    assert not report.ok and "no link" in report.describe()


async def test_links_removed_behind_an_anchor_moved_by_hand_are_reported_by_verify(db):
    await _insert(db, [_row(n=i) for i in range(4)])
    await seal(db)
    async with db.begin() as conn:  # the triggers are on; no owner rights are used
        hash_at_3 = await conn.scalar(sa.select(audit_links.c.chain_hash).where(audit_links.c.chain_seq == 3))
        await conn.execute(sa.update(audit_chains).values(anchor_seq=3, anchor_hash=hash_at_3))
        await conn.execute(sa.delete(audit_links).where(audit_links.c.chain_seq <= 3))
    report = await _verify(db)
    assert not report.ok and "no link" in report.describe()


async def test_a_row_given_an_existing_id_does_not_stop_the_sealing_of_any_tenant(db):
    [genuine] = await _insert(db, [_row(n=1, created_at=months_ago(1))])
    await seal(db)
    await _insert(db, [_row(n=2, id=genuine, outcome="FORGED", created_at=months_ago(0))])
    await _insert(db, [_row("globex", n=3)])
    await seal(db)
    assert (await _verify(db, "globex")).verified_rows == 1
    assert await unlinked_rows(db) == []
    async with db.connect() as conn:
        listed = (await conn.execute(select_rows("acme", AuditFilters()))).all()
    by_outcome = {row.outcome: row.chain_seq for row in listed}
    assert by_outcome["FORGED"] != by_outcome[_row(n=1)["outcome"]]  # each shows its own link


async def test_a_row_sealed_before_a_pruned_one_is_still_checked(db):
    kept = await _insert(db, [_row(n=i) for i in range(5)])
    await seal(db)
    await _insert(db, [_row(n=9, created_at=months_ago(5))])  # an old time, sealed after the others
    assert (await prune_module.prune(db, older_than=timedelta(days=90))).tenants[0].anchor_seq == 0
    await seal(db)
    await _tamper(db, sa.update(audit_events).where(audit_events.c.id == kept[2]).values(outcome="X"))
    report = await _verify(db)
    assert not report.ok and report.broken_row_id == kept[2]


async def test_making_a_partition_gives_up_soon_behind_a_long_reader_and_does_not_retry_at_once(db):
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1 + 3
    async with db.begin() as conn:
        await conn.execute(sa.text(f"DROP TABLE audit_events_p{index // 12:04d}_{index % 12 + 1:02d}"))
    sealer = AuditSealer(db)
    async with db.engine.connect() as export:
        await export.begin()
        await export.execute(sa.select(sa.func.count()).select_from(audit_events))  # holds its lock
        # Neither the sealer nor a reader queued behind it waits for the export to end.
        await asyncio.wait_for(sealer.seal_once(wait=True), timeout=30)
        async with db.connect() as reader:
            await asyncio.wait_for(reader.execute(sa.select(sa.func.count()).select_from(audit_events)), timeout=30)
        assert not sealer._maintenance_due()  # backed off: no new attempt next round
        await export.rollback()
