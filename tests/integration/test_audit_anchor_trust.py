"""The chain's stored start (``audit_chains.anchor_seq`` / ``anchor_hash``) is trusted only for
rows that are gone: someone with the tables' owner's rights who moves it over rows still there,
even onto a signed anchor, is caught; and a row the prune keeps is still chained. PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from gateway.audit.anchor import Anchor
from gateway.audit.chain import audit_events, audit_links, content_hash, genesis_hash, link_hash
from gateway.audit.prune import parse_age, prune
from gateway.audit.sealer import AuditSealer, audit_chains, ensure_partitions
from gateway.audit.verify import _OLDEST_PARTITION, verify_chain
from gateway.db.engine import Database
from tests.conftest import seeded
from tests.integration.test_audit_chain import _insert, _row, _signed, _tampering, _verify
from tests.support.db import across_a_month_boundary, month_start, months_ago, open_database, relink_as_version_1
from tests.support.processes import run_cli


@pytest.fixture
async def pg_db(pg_url: str) -> AsyncIterator[Database]:
    """The demo tenants' database of ``pg_url`` (the one the CLI is run against), opened."""
    await seeded(pg_url)
    async with open_database(pg_url) as database:
        yield database


async def _relink_one(db: Database, row_id: int, **values: Any) -> None:
    """Rewrite a sealed row and recompute its own link only (content and chain hash)."""
    async with _tampering(db) as conn:
        await conn.execute(sa.update(audit_events).where(audit_events.c.id == row_id).values(**values))
        row = (await conn.execute(sa.select(audit_events).where(audit_events.c.id == row_id))).one()
        link = (await conn.execute(sa.select(audit_links).where(audit_links.c.audit_id == row_id))).one()
        forged = content_hash(row)
        await conn.execute(
            sa.update(audit_links).where(audit_links.c.audit_id == row_id)
            .values(content_hash=forged, chain_hash=link_hash(link.chain_seq, link.prev_hash, forged, link.created_at))
        )


async def _hash_at(db: Database, seq: int, tenant: str = "acme") -> str:
    async with db.connect() as conn:
        return str(await conn.scalar(
            sa.select(audit_links.c.chain_hash).where(audit_links.c.tenant_id == tenant, audit_links.c.chain_seq == seq)
        ))


async def _link_at(db: Database, seq: int, tenant: str = "acme") -> Any:
    async with db.connect() as conn:
        return (await conn.execute(
            sa.select(audit_links).where(audit_links.c.tenant_id == tenant, audit_links.c.chain_seq == seq)
        )).one()


_UNCHANGED: Any = object()


async def _move_start(db: Database, seq: int, start_hash: str, tenant: str = "acme", *, kept: Any = _UNCHANGED) -> None:
    """Set the stored start as an owner can; ``kept``: the link it claims to have replaced (a
    link row, or None for none, as an earlier release left it)."""
    values: dict[str, Any] = {"anchor_seq": seq, "anchor_hash": start_hash}
    if kept is not _UNCHANGED:
        values |= {
            "start_prev_hash": kept and kept.prev_hash, "start_content_hash": kept and kept.content_hash,
            "start_linked_at": kept and kept.created_at, "start_hash_version": kept and kept.hash_version,
        }
    async with db.begin() as conn:  # audit_chains has no trigger
        await conn.execute(sa.update(audit_chains).where(audit_chains.c.tenant_id == tenant).values(**values))


@pytest.mark.postgres
async def test_a_row_rewritten_before_a_signed_anchor_is_caught_when_the_start_is_moved_onto_the_anchor(
    pg_url, pg_db, tmp_path
):
    """The review's reproduction: seven rows, sealed and anchored at position 7; then, as the
    owner, row 4 rewritten with its own link recomputed, and the stored start set to the signed
    position and hash."""
    anchor_file = tmp_path / "acme.anchor"
    ids = await _insert(pg_db, [_row(n=i) for i in range(7)])
    assert await AuditSealer(pg_db).seal_pending() == 7
    anchored = _signed(pg_url, "anchor", "--tenant", "acme", "--out", str(anchor_file))
    assert anchored.returncode == 0 and "anchored chain position 7" in anchored.stdout, anchored.stderr

    await _relink_one(pg_db, ids[3], user_id="mallory")
    await _move_start(pg_db, 7, await _hash_at(pg_db, 7))

    caught = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(anchor_file))
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert f"BROKEN at row id {ids[0]} (chain position 1)" in caught.stdout
    assert "before the chain's stored start (position 7)" in caught.stdout
    plain = run_cli(pg_url, "audit", "verify", "--tenant", "acme")
    assert plain.returncode == 1 and f"BROKEN at row id {ids[0]}" in plain.stdout

    # With only the start moved back, the rewritten row breaks the chain at the next row.
    await _move_start(pg_db, 0, genesis_hash("acme"))
    relinked = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(anchor_file))
    assert relinked.returncode == 1 and f"BROKEN at row id {ids[4]} (chain position 5)" in relinked.stdout


async def test_rows_removed_with_their_links_and_a_start_no_prune_recorded_are_caught(db):
    ids = await _insert(db, [_row(n=i) for i in range(6)])
    await AuditSealer(db).seal_pending()
    hash_at_3 = await _hash_at(db, 3)
    async with _tampering(db) as conn:
        await conn.execute(sa.delete(audit_events).where(audit_events.c.id.in_(ids[:3])))
        await conn.execute(sa.delete(audit_links).where(audit_links.c.audit_id.in_(ids[:3])))
    await _move_start(db, 3, hash_at_3)

    report = await _verify(db)
    assert not report.ok
    assert "BROKEN at the chain's start (chain position 3)" in report.describe()
    assert "no prune recorded that start" in report.describe()
    anchored = Anchor(tenant_id="acme", chain_seq=3, chain_hash=hash_at_3, issued_at=datetime.now(UTC), key_id="k")
    async with db.connect() as conn:
        assert not (await verify_chain(conn, tenant_id="acme", anchor=anchored)).ok


async def test_a_start_moved_past_the_one_the_last_prune_recorded_is_caught(db):
    old = months_ago(5)
    await _insert(db, [_row(n=i, created_at=old + timedelta(seconds=i)) for i in range(3)])
    ids = await _insert(db, [_row(n=i) for i in range(3, 8)])
    await AuditSealer(db).seal_pending()
    assert (await prune(db, older_than=parse_age("90d"))).tenants[0].anchor_seq == 3
    await AuditSealer(db).seal_pending()
    assert (await _verify(db)).ok

    link_5 = await _link_at(db, 5)
    async with _tampering(db) as conn:
        await conn.execute(sa.delete(audit_events).where(audit_events.c.id.in_(ids[:2])))
        await conn.execute(sa.delete(audit_links).where(audit_links.c.audit_id.in_(ids[:2])))
    await _move_start(db, 5, link_5.chain_hash)  # the link kept for 3 is cleared with the move
    report = await _verify(db)
    assert not report.ok and "the tenant's last audit_prune row names position 3" in report.describe()

    await _move_start(db, 5, link_5.chain_hash, kept=await _link_at(db, 6))  # another position's link
    report = await _verify(db)
    assert not report.ok and "the chain's start does not hash to the link it keeps" in report.describe()

    await _move_start(db, 5, link_5.chain_hash, kept=link_5)  # and the link it replaced, written as kept
    report = await _verify(db)
    assert not report.ok and "in a month still kept" in report.describe()

    await _move_start(db, 5, link_5.chain_hash, kept=None)  # or none, as an earlier release kept
    report = await _verify(db)
    assert not report.ok and "the tenant's last audit_prune row names position 3" in report.describe()


async def test_a_kept_row_sealed_before_a_pruned_one_cannot_be_rewritten_with_its_own_link(db):
    """The review's second note: a row of a kept month sealed before a row of a dropped month
    stayed behind the anchor, checked only against its own link."""
    old, young_at, age = across_a_month_boundary()
    kept = await _insert(db, [_row(n=i, created_at=young_at + timedelta(seconds=i)) for i in range(3)])
    await AuditSealer(db).seal_pending()
    await _insert(db, [_row(n=9, created_at=old)])  # written before midnight, sealed after the others
    await _insert(db, [_row(n=i) for i in range(10, 12)])
    await AuditSealer(db).seal_pending()
    [result] = (await prune(db, older_than=age)).tenants
    assert (result.removed_rows, result.anchor_seq) == (1, 0)
    await AuditSealer(db).seal_pending()
    intact = await _verify(db)
    assert (intact.ok, intact.verified_rows, intact.pruned_rows) == (True, 7, 1)

    await _relink_one(db, kept[1], outcome="FORGED")
    report = await _verify(db)
    assert (report.ok, report.broken_row_id, report.broken_seq) == (False, kept[2], 3)


async def test_a_signed_anchor_among_pruned_rows_is_checked_through_their_links(db):
    old, young_at, age = across_a_month_boundary()
    kept = await _insert(db, [_row(n=0, created_at=young_at)])
    await AuditSealer(db).seal_pending()
    await _insert(db, [_row(n=i, created_at=old + timedelta(seconds=i)) for i in range(1, 4)])
    await _insert(db, [_row(n=4)])
    await AuditSealer(db).seal_pending()
    anchored = Anchor(
        tenant_id="acme", chain_seq=3, chain_hash=await _hash_at(db, 3), issued_at=datetime.now(UTC), key_id="k"
    )
    await prune(db, older_than=age)
    async with db.connect() as conn:
        report = await verify_chain(conn, tenant_id="acme", anchor=anchored)
    assert report.ok, report.describe()
    assert (report.anchor_seq, report.pruned_rows) == (0, 3)

    await _relink_one(db, kept[0], outcome="FORGED")
    async with db.connect() as conn:
        report = await verify_chain(conn, tenant_id="acme", anchor=anchored)
    assert not report.ok and report.broken_seq == 2


async def test_a_row_deleted_behind_a_forged_prune_record_is_caught(db):
    """The second review: a prune record is a row anyone who can write rows can write. One
    naming a far month, then a row deleted with its link kept, must not pass as pruned."""
    # Dated two days into this month (whatever today is): the chain is past any month's start.
    written = month_start(0) + timedelta(days=2)
    ids = await _insert(db, [_row(n=i, created_at=written + timedelta(hours=i)) for i in range(5)])
    await AuditSealer(db).seal_pending()
    forged = {"through_chain_seq": 0, "removed_rows": 1, "months": ["2099-12"]}
    await _insert(db, [_row(n=9, kind="audit_prune", detail=forged, created_at=written + timedelta(hours=6))])
    await AuditSealer(db).seal_pending()
    async with _tampering(db) as conn:
        await conn.execute(sa.delete(audit_events).where(audit_events.c.id == ids[2]))
    report = await _verify(db)
    assert (report.ok, report.broken_row_id, report.broken_seq) == (False, ids[2], 3)
    assert "its audit row is missing" in report.describe()

    # Its link dated back into a month no partition holds any more: still not a pruned row,
    # since rows written well after the oldest kept month began come before it.
    async with _tampering(db) as conn:
        await conn.execute(
            sa.update(audit_links).where(audit_links.c.audit_id == ids[2]).values(created_at=months_ago(30))
        )
    report = await _verify(db)
    assert (report.ok, report.broken_seq) == (False, 3)


async def _old_rows_in_their_month(db: Database) -> tuple[list[int], datetime]:
    """Three rows two months old, in their own month's partition, then two of today and a prune
    record, sealed."""
    old = months_ago(2)
    ids = await _insert(db, [_row(n=i, created_at=old + timedelta(hours=i)) for i in range(3)])
    await _insert(db, [_row(n=i) for i in range(3, 5)])
    # A prune record naming the start where it is (one a real earlier prune leaves, or written)
    await _insert(db, [_row(n=9, kind="audit_prune", detail={"through_chain_seq": 0, "months": []})])
    async with db.begin() as conn:
        await ensure_partitions(conn)  # the old rows move out of the default partition
    await AuditSealer(db).seal_pending()
    assert (await _verify(db)).ok
    return ids, old


async def test_a_partition_renamed_to_hide_rows_deleted_from_it_is_caught(pg_url):
    """The third review: the oldest kept month was found by its partition's name, so renaming
    the partition made its rows look older than every kept month. Its bounds tell. (A database
    of its own: partitions outlive the emptying of the shared one.)"""
    await seeded(pg_url)
    async with open_database(pg_url) as db:
        ids, old = await _old_rows_in_their_month(db)
        async with _tampering(db) as conn:
            await conn.execute(sa.text(f'ALTER TABLE "audit_events_p{old:%Y_%m}" RENAME TO audit_events_old'))
            await conn.execute(sa.delete(audit_events).where(audit_events.c.id == ids[1]))
        report = await _verify(db)
    assert (report.ok, report.broken_seq) == (False, 2)


async def test_the_oldest_month_dropped_without_a_prune_is_caught_even_under_a_signed_anchor(pg_url):
    """The third review: a partition dropped by hand, the start left where it was: the links
    of its rows stay and still chain to the anchor. A prune always leaves the row just past
    the start, so a first link without its row is a removal."""
    await seeded(pg_url)
    async with open_database(pg_url) as db:
        _, old = await _old_rows_in_their_month(db)
        anchored = Anchor(
            tenant_id="acme", chain_seq=3, chain_hash=await _hash_at(db, 3), issued_at=datetime.now(UTC), key_id="k"
        )
        async with _tampering(db) as conn:
            await conn.execute(sa.text(f'DROP TABLE "audit_events_p{old:%Y_%m}"'))
        async with db.connect() as conn:
            report = await verify_chain(conn, tenant_id="acme", anchor=anchored)
    assert (report.ok, report.broken_seq) == (False, 1)


async def test_a_row_of_the_oldest_kept_month_cannot_pass_as_pruned_by_its_link_dated_back(pg_url):
    """A link's time is covered by its chain hash (link-hash version 2, migration 0022). Before,
    an owner could delete a row written on the first day of the oldest kept month, date its
    link back into a month no partition holds, and verify took the row for a pruned one."""
    await seeded(pg_url)
    async with open_database(pg_url) as db:
        first_day = month_start(0) + timedelta(hours=1)
        ids = await _insert(db, [_row(n=i, created_at=first_day + timedelta(minutes=i)) for i in range(2)])
        await _insert(db, [_row(n=2), _row(n=9, kind="audit_prune", detail={"through_chain_seq": 0, "months": []})])
        await AuditSealer(db).seal_pending()
        async with db.connect() as conn:
            assert await conn.scalar(_OLDEST_PARTITION) == month_start(0)
        assert (await _verify(db)).ok
        async with _tampering(db) as conn:
            await conn.execute(sa.delete(audit_events).where(audit_events.c.id == ids[1]))
            await conn.execute(
                sa.update(audit_links).where(audit_links.c.audit_id == ids[1]).values(created_at=months_ago(1))
            )
        report = await _verify(db)
    assert (report.ok, report.broken_row_id, report.broken_seq) == (False, ids[1], 2)
    assert "its chain hash does not link" in report.describe()


async def _versions(db: Database) -> list[int]:
    async with db.connect() as conn:
        return list((await conn.scalars(
            sa.select(audit_links.c.hash_version).where(audit_links.c.tenant_id == "acme")
            .order_by(audit_links.c.chain_seq)
        )).all())


async def test_a_links_hash_version_lowered_is_caught(db):
    ids = await _insert(db, [_row(n=i) for i in range(3)])
    await AuditSealer(db).seal_pending()
    assert await _versions(db) == [2, 2, 2]
    async with _tampering(db) as conn:
        await conn.execute(sa.update(audit_links).where(audit_links.c.audit_id == ids[1]).values(hash_version=1))
    report = await _verify(db)
    assert (report.ok, report.broken_seq) == (False, 2)
    assert "its chain hash does not link" in report.describe()


async def test_a_chain_sealed_by_the_release_before_goes_on_in_version_2_and_verifies(db):
    """Links sealed before migration 0022 are version 1 (the column's default), and the chain
    goes on from them."""
    await _insert(db, [_row(n=i) for i in range(3)])
    await AuditSealer(db).seal_pending()
    await relink_as_version_1(db)
    assert (await _verify(db)).ok
    await _insert(db, [_row(n=i) for i in range(3, 5)])
    await AuditSealer(db).seal_pending()
    assert await _versions(db) == [1, 1, 1, 2, 2]
    report = await _verify(db)
    assert report.ok and report.verified_rows == 5, report.describe()


@pytest.mark.postgres
@pytest.mark.parametrize("kept_link", ["none", "of-the-new-start", "version-1", "re-bounded-partition"])
async def test_rows_of_a_kept_month_removed_before_a_signed_anchor_behind_a_moved_start_are_caught(
    pg_url, pg_db, tmp_path, kept_link
):
    """The fourth review's reproduction: twenty rows of this month sealed and anchored at 20;
    then, as the owner, the start moved to position 12 with its true chain hash, the links and
    rows up to it deleted, and a prune record naming 12 written. The start's hash is genuine
    and the chain after it intact: only the start's time (a month still kept), or its having
    moved since the anchor saw it, gives it away."""
    anchor_file = tmp_path / "acme.anchor"
    ids = await _insert(pg_db, [_row(n=i) for i in range(20)])
    assert await AuditSealer(pg_db).seal_pending() == 20
    if kept_link == "version-1":  # sealed by the release before 0022: a link's hash without its time
        await relink_as_version_1(pg_db)
    anchored = _signed(pg_url, "anchor", "--tenant", "acme", "--out", str(anchor_file))
    assert anchored.returncode == 0 and "anchored chain position 20" in anchored.stdout, anchored.stderr

    link_12 = await _link_at(pg_db, 12)
    await _move_start(pg_db, 12, link_12.chain_hash, kept=None if kept_link == "none" else link_12)
    async with _tampering(pg_db) as conn:
        await conn.execute(sa.delete(audit_links).where(audit_links.c.chain_seq <= 12))
        await conn.execute(sa.delete(audit_events).where(audit_events.c.id.in_(ids[:12])))
    if kept_link == "re-bounded-partition":  # the month made to begin after the start's row
        month = f"audit_events_p{link_12.created_at:%Y_%m}"
        begin = (link_12.created_at + timedelta(microseconds=1)).isoformat()
        end = month_start(-1).isoformat()
        async with pg_db.begin() as conn:
            await conn.execute(sa.text(f"ALTER TABLE audit_events DETACH PARTITION {month}"))
            await conn.execute(sa.text(
                f"ALTER TABLE audit_events ATTACH PARTITION {month} FOR VALUES FROM ('{begin}') TO ('{end}')"
            ))
    forged = {"through_chain_seq": 12, "removed_rows": 12, "months": ["2020-01"]}
    await _insert(pg_db, [_row(n=99, kind="audit_prune", detail=forged)])
    await AuditSealer(pg_db).seal_pending()

    caught = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(anchor_file))
    assert caught.returncode == 1, caught.stdout + caught.stderr
    said = {
        "none": "BROKEN at the chain's start (chain position 12): the chain's start moved from position 0",
        "of-the-new-start": "BROKEN at the chain's start (chain position 12): the chain's start is the link of a "
                            "row written",
        "version-1": "BROKEN at the chain's start (chain position 12): the chain's start moved from position 0",
        "re-bounded-partition": "BROKEN at the audit's partitions (chain position 12): a partition of audit_events "
                                "does not begin at a month's start",
    }[kept_link]
    assert said in caught.stdout


@pytest.mark.postgres
async def test_an_anchor_taken_before_a_prune_still_verifies_after_it(pg_url, pg_db, tmp_path):
    anchor_file = tmp_path / "acme.anchor"
    old = months_ago(5)
    await _insert(pg_db, [_row(n=i, created_at=old + timedelta(seconds=i)) for i in range(3)])
    await _insert(pg_db, [_row(n=i) for i in range(3, 6)])
    await AuditSealer(pg_db).seal_pending()
    anchored = _signed(pg_url, "anchor", "--tenant", "acme", "--out", str(anchor_file))
    assert anchored.returncode == 0 and "anchored chain position 6" in anchored.stdout, anchored.stderr
    assert (await prune(pg_db, older_than=parse_age("90d"))).tenants[0].anchor_seq == 3
    await AuditSealer(pg_db).seal_pending()
    async with pg_db.connect() as conn:
        chain = (await conn.execute(sa.select(audit_chains))).one()
    assert chain.start_linked_at == old + timedelta(seconds=2)  # the dropped month's last row's link

    verified = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(anchor_file))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "unchanged up to the signed anchor at chain position 6" in verified.stdout



async def test_a_start_moved_by_the_release_before_reads_as_its_own(db):
    """During a rolling upgrade the release before may prune: it moves the start and leaves
    the link an earlier prune of this release kept. The start then keeps none, as that
    release's starts do, rather than one that no longer hashes to it."""
    old = months_ago(5)
    await _insert(db, [_row(n=i, created_at=old + timedelta(seconds=i)) for i in range(3)])
    await _insert(db, [_row(n=i) for i in range(3, 6)])
    await AuditSealer(db).seal_pending()
    await prune(db, older_than=parse_age("90d"))
    async with db.begin() as conn:  # what the release before's prune writes: the start alone
        await conn.execute(sa.update(audit_chains).values(anchor_seq=4, anchor_hash=await _hash_at(db, 4)))
        chain = (await conn.execute(sa.select(audit_chains))).one()
    assert (chain.start_prev_hash, chain.start_content_hash, chain.start_linked_at, chain.start_hash_version) == (
        None, None, None, None
    )
