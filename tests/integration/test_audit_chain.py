"""The audit hash chain: sealing, verification, tampering, retention."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.audit.chain import (
    CANONICAL_FIELDS,
    CHAIN_FIELDS,
    WRITE_ORDER_FIELDS,
    audit_events,
    audit_links,
    content_hash,
)
from gateway.audit.prune import parse_age, prune
from gateway.audit.sealer import AuditSealer
from gateway.audit.verify import VerifyReport, verify_chain
from gateway.db.engine import Database
from gateway.settings import Settings
from tests.conftest import seeded
from tests.support.db import across_a_month_boundary, months_ago
from tests.support.processes import run_cli


def _row(tenant: str = "acme", n: int = 0, **overrides: Any) -> dict[str, Any]:
    row = {
        "tenant_id": tenant, "kind": "tool_call", "user_id": "alice", "run_id": f"run_{n % 3}",
        "tool_call_id": f"call_{n}", "tool": "add", "arguments": {"a": n, "b": 1.5, "note": "é"},
        "arguments_sha256": "0" * 64, "outcome": "OK", "duration_ms": 1.25, "approval_id": None,
        "request_id": f"req_{n}", "error_id": None, "detail": {"n": n}, "created_at": datetime.now(UTC),
    }
    row.update(overrides)
    return row


async def _insert(db: Database, rows: list[dict[str, Any]]) -> list[int]:
    async with db.begin() as conn:
        ids = []
        for row in rows:
            ids.append(int((await conn.execute(sa.insert(audit_events).values(**row).returning(audit_events.c.id))).scalar_one()))
        return ids


async def _verify(db: Database, tenant: str = "acme") -> VerifyReport:
    async with db.connect() as conn:
        return await verify_chain(conn, tenant_id=tenant)


@asynccontextmanager
async def _tampering(db: Database) -> AsyncIterator[AsyncConnection]:
    """A transaction of an attacker with the tables' owner's rights: the database refuses to
    change or delete audit rows and links (migration 0013), but an owner can switch its
    triggers off, as this does for the one transaction. What the chain must still catch."""
    async with db.begin() as conn:
        await conn.execute(sa.text("ALTER TABLE audit_events DISABLE TRIGGER USER"))
        await conn.execute(sa.text("ALTER TABLE audit_links DISABLE TRIGGER USER"))
        yield conn
        await conn.execute(sa.text("ALTER TABLE audit_links ENABLE TRIGGER USER"))
        await conn.execute(sa.text("ALTER TABLE audit_events ENABLE TRIGGER USER"))


async def _tamper(db: Database, stmt: Any) -> None:
    async with _tampering(db) as conn:
        await conn.execute(stmt)


def test_the_canonical_content_covers_every_column_but_the_transaction_id():
    assert set(CANONICAL_FIELDS) | set(WRITE_ORDER_FIELDS) == set(audit_events.c.keys())
    assert not set(CANONICAL_FIELDS) & set(WRITE_ORDER_FIELDS)
    assert set(CHAIN_FIELDS) == set(audit_links.c.keys()) - {"tenant_id", "audit_id", "created_at"}


@pytest.mark.parametrize("field", [f for f in CANONICAL_FIELDS if f != "id"])
def test_changing_any_covered_field_changes_the_content_hash(field: str):
    class Row:
        def __init__(self, values: dict[str, Any]) -> None:
            self.__dict__.update(values)

    base = _row(n=1) | {"id": 7}
    changed = dict(base)
    changed[field] = {
        "created_at": base["created_at"] + timedelta(microseconds=1), "arguments": {"a": 1, "b": 1.5, "note": "e"},
        "detail": {"n": 2}, "duration_ms": 1.5,
    }.get(field, "different")
    assert content_hash(Row(base)) != content_hash(Row(changed))


async def test_sealed_rows_verify_and_unsealed_rows_are_reported(db):
    await _insert(db, [_row(n=i) for i in range(5)])
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 0, 5)

    assert await AuditSealer(db, batch_size=2).seal_pending() == 5
    await _insert(db, [_row(n=i) for i in range(5, 7)])
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.unsealed_rows, report.head_seq) == (True, 5, 2, 5)


ODD_JSON = {"big": 2**70, "tiny": 5e-324, "huge": 1e300, "neg_zero": -0.0, "text": "\u2028é😀\"\\", "": None,
            "nested": [[[{"z": 1, "a": [True, False]}]]]}


async def test_rows_the_sealer_reads_through_the_driver_hash_as_verify_reads_them(db):
    # The sealer reads rows with the driver, verify with SQLAlchemy: odd JSON values, times
    # and floats must come out the same both ways, or a sound chain would be reported broken.
    await _insert(db, [_row(n=i, arguments=ODD_JSON, detail={"odd": ODD_JSON}, duration_ms=0.1 + i,
                            created_at=datetime(2026, 12, 2, 3, 4, 5, 999999, tzinfo=UTC)) for i in range(3)])
    assert await AuditSealer(db).seal_pending() == 3
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 3, 0)


async def test_each_tenant_has_its_own_chain(db):
    await _insert(db, [_row("acme" if i % 2 else "globex", n=i) for i in range(9)])
    await AuditSealer(db).seal_pending()
    acme, globex = await _verify(db, "acme"), await _verify(db, "globex")
    assert (acme.ok, acme.verified_rows, acme.head_seq) == (True, 4, 4)
    assert (globex.ok, globex.verified_rows, globex.head_seq) == (True, 5, 5)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("outcome", "BUDGET_EXCEEDED"),
        ("user_id", "mallory"),
        ("arguments", {"a": 99}),
        ("detail", None),
        ("duration_ms", 0.5),
        ("tenant_id", "globex"),
        ("created_at", datetime(2020, 1, 1, tzinfo=UTC)),
    ],
)
async def test_a_changed_row_is_named_as_the_first_broken_row(db, column, value):
    ids = await _insert(db, [_row(n=i) for i in range(6)])
    await AuditSealer(db).seal_pending()
    await _tamper(db, sa.update(audit_events).where(audit_events.c.id == ids[3]).values({column: value}))
    report = await _verify(db)
    assert not report.ok
    assert report.broken_row_id == ids[3]
    if column == "tenant_id":  # the row left the tenant: its link finds no row
        assert "missing" in (report.reason or "")
    else:
        assert "content" in (report.reason or "")
    assert report.verified_rows == 3


async def test_a_deleted_row_is_named_by_its_link(db):
    ids = await _insert(db, [_row(n=i) for i in range(5)])
    await AuditSealer(db).seal_pending()
    await _tamper(db, sa.delete(audit_events).where(audit_events.c.id == ids[2]))
    report = await _verify(db)
    assert (report.ok, report.broken_row_id, report.verified_rows) == (False, ids[2], 2)
    assert "missing" in (report.reason or "")


async def test_a_deleted_row_and_its_link_break_the_chain_at_the_next_row(db):
    ids = await _insert(db, [_row(n=i) for i in range(5)])
    await AuditSealer(db).seal_pending()
    async with _tampering(db) as conn:
        await conn.execute(sa.delete(audit_events).where(audit_events.c.id == ids[2]))
        await conn.execute(sa.delete(audit_links).where(audit_links.c.audit_id == ids[2]))
    report = await _verify(db)
    assert (report.ok, report.broken_row_id) == (False, ids[3])


async def test_a_link_removed_in_the_middle_breaks_the_chain_at_the_next_row(db):
    ids = await _insert(db, [_row(n=i) for i in range(5)])
    await AuditSealer(db).seal_pending()
    await _tamper(db, sa.delete(audit_links).where(audit_links.c.audit_id == ids[1]))
    report = await _verify(db)
    assert (report.ok, report.broken_row_id, report.unsealed_rows) == (False, ids[2], 0)


async def test_a_cut_tail_is_caught_by_the_stored_head(db):
    ids = await _insert(db, [_row(n=i) for i in range(4)])
    await AuditSealer(db).seal_pending()
    async with _tampering(db) as conn:
        await conn.execute(sa.delete(audit_events).where(audit_events.c.id == ids[-1]))
        await conn.execute(sa.delete(audit_links).where(audit_links.c.audit_id == ids[-1]))
    report = await _verify(db)
    assert not report.ok
    assert "end" in (report.reason or "")


async def test_relinking_a_forged_row_without_the_head_is_caught(db):
    """A forger who rewrites a row and recomputes its hashes still cannot match the head."""
    from gateway.audit.chain import link_hash

    ids = await _insert(db, [_row(n=i) for i in range(3)])
    await AuditSealer(db).seal_pending()
    async with _tampering(db) as conn:
        await conn.execute(sa.update(audit_events).where(audit_events.c.id == ids[2]).values(outcome="FORGED"))
        row = (await conn.execute(sa.select(audit_events).where(audit_events.c.id == ids[2]))).first()
        link = (await conn.execute(sa.select(audit_links).where(audit_links.c.audit_id == ids[2]))).first()
        forged = content_hash(row)
        await conn.execute(
            sa.update(audit_links).where(audit_links.c.audit_id == ids[2]).values(
                content_hash=forged, chain_hash=link_hash(link.chain_seq, link.prev_hash, forged, link.created_at)
            )
        )
    report = await _verify(db)
    assert not report.ok and "head" in (report.reason or "")


async def test_prune_drops_old_months_and_the_chain_verifies_from_the_anchor(db):
    old = months_ago(5)
    await _insert(db, [_row(n=i, created_at=old + timedelta(seconds=i)) for i in range(4)])
    kept = await _insert(db, [_row(n=i) for i in range(4, 7)])
    await AuditSealer(db).seal_pending()

    pruned = await prune(db, older_than=parse_age("90d"))
    assert pruned.months == (f"audit_events_p{old:%Y_%m}",)
    [result] = pruned.tenants
    assert (result.tenant_id, result.removed_rows, result.anchor_seq) == ("acme", 4, 4)
    async with db.connect() as conn:
        left = list((await conn.execute(
            sa.select(audit_events.c.id).where(audit_events.c.tenant_id == "acme", audit_events.c.kind != "audit_prune")
        )).scalars())
        links = await conn.scalar(sa.select(sa.func.min(audit_links.c.chain_seq)).where(audit_links.c.tenant_id == "acme"))
    assert sorted(left) == kept
    assert links == 5  # the links of the dropped month went with it

    await AuditSealer(db).seal_pending()  # the prune's own audit row
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.anchor_seq) == (True, 4, 4)

    # Tampering after a prune is still caught, the first kept row included.
    await _tamper(db, sa.update(audit_events).where(audit_events.c.id == kept[0]).values(outcome="X"))
    assert (await _verify(db)).broken_row_id == kept[0]


async def test_prune_keeps_months_that_are_not_whole_past_the_cutoff(db):
    recent = months_ago(1)
    await _insert(db, [_row(n=0, created_at=recent), _row(n=1)])
    await AuditSealer(db).seal_pending()
    # A month is dropped only once all of it is older than the cut-off.
    pruned = await prune(db, older_than=timedelta(days=70), now=recent + timedelta(days=70))
    assert (pruned.months, pruned.tenants) == ((), ())
    async with db.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(audit_events)) == 2


async def test_prune_seals_old_rows_first_and_a_kept_row_sealed_earlier_stays_chained(db):
    """Rows sealed out of created_at order near a month's end: a row of a kept month sealed
    before a row of a dropped month keeps the chain's start below it, and the links of the
    dropped rows after it stay, so that it is still chained to the rows after it."""
    old, young_at, age = across_a_month_boundary()
    [first_old, young, second_old] = await _insert(
        db, [_row(n=0, created_at=old), _row(n=1, created_at=young_at), _row(n=2, created_at=old)]
    )
    await AuditSealer(db).seal_pending()
    [unsealed_old] = await _insert(db, [_row(n=3, created_at=old)])

    pruned = await prune(db, older_than=age)

    # The prune sealed the old row first, then dropped its whole month.
    [result] = pruned.tenants
    assert (result.removed_rows, result.anchor_seq) == (3, 1)
    async with db.connect() as conn:
        left = {r.id: r.chain_seq for r in (await conn.execute(
            sa.select(audit_events.c.id, audit_links.c.chain_seq)
            .select_from(audit_events.outerjoin(audit_links, audit_links.c.audit_id == audit_events.c.id))
            .where(audit_events.c.kind != "audit_prune")
        )).all()}
        links = dict((await conn.execute(sa.select(audit_links.c.chain_seq, audit_links.c.audit_id))).all())
    assert left == {young: 2}  # kept, with its link
    assert first_old not in left and second_old not in left and unsealed_old not in left
    assert links == {2: young, 3: second_old, 4: unsealed_old}  # the dropped rows' links after it stay
    await AuditSealer(db).seal_pending()
    report = await _verify(db)
    assert (report.ok, report.anchor_seq, report.verified_rows, report.pruned_rows) == (True, 1, 4, 2)
    assert "4 sealed row(s) verified (chain positions 2..5; 2 of them pruned" in report.describe()


async def test_a_row_written_into_a_month_while_it_is_pruned_is_sealed_before_the_month_goes(db):
    """The prune locks the table before the drop and looks again: a row committed meanwhile
    into a month being dropped rolls the prune back, and the next attempt seals it first."""
    old = months_ago(5)
    await _insert(db, [_row(n=0, created_at=old)])
    await AuditSealer(db).seal_pending()
    async with db.engine.connect() as late:
        await late.begin()
        await late.execute(sa.insert(audit_events).values(**_row(n=1, created_at=old)))
        pruning = asyncio.create_task(prune(db, older_than=timedelta(days=90)))
        await asyncio.sleep(1.0)
        assert not pruning.done()  # waiting for the writer's lock
        await late.commit()
    pruned = await asyncio.wait_for(pruning, 60)
    [result] = pruned.tenants
    assert (result.removed_rows, result.anchor_seq) == (2, 2)
    async with db.connect() as conn:
        assert await conn.scalar(
            sa.select(sa.func.count()).select_from(audit_events).where(audit_events.c.kind != "audit_prune")
        ) == 0
    await AuditSealer(db).seal_pending()
    assert (await _verify(db)).ok


async def test_the_chain_verifies_across_three_months_and_the_default_partition(db):
    ids = await _insert(db, [
        _row(n=0, created_at=months_ago(2)),
        _row(n=1, created_at=months_ago(1, day=28)),
        _row(n=2),
        _row("globex", n=3, created_at=months_ago(1)),
        _row(n=4, created_at=months_ago(40)),  # no month made for it: the default partition
    ])
    await AuditSealer(db).seal_pending()
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.head_seq) == (True, 4, 4)
    async with db.connect() as conn:
        where = dict((await conn.execute(
            sa.select(audit_events.c.id, sa.text("tableoid::regclass::text")).select_from(audit_events)
        )).all())
    # The sealer's round made the partitions for the months whose rows sat in the default.
    assert where[ids[4]] == f"audit_events_p{months_ago(40):%Y_%m}"
    assert len({where[i] for i in ids}) == 4


def test_ages_parse_and_nonsense_is_refused():
    assert parse_age("90d") == timedelta(days=90)
    assert parse_age("12h") == timedelta(hours=12)
    for bad in ("90", "d", "-1d", "0d", "1y", "36601d", "9" * 400 + "d", "9" * 5000):
        with pytest.raises(ValueError):
            parse_age(bad)


@pytest.mark.postgres
async def test_a_row_of_a_transaction_open_while_the_sealer_runs_is_sealed_after_it_commits(pg_url):
    """The sealer seals only rows of finished transactions, in the order of their transaction
    ids: an open transaction holds later rows back, and its own row is never skipped."""
    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        [before] = await _insert(db, [_row(n=9)])
        async with db.engine.connect() as slow:
            await slow.begin()
            [slow_id] = [
                int((await slow.execute(sa.insert(audit_events).values(**_row(n=0)).returning(audit_events.c.id))).scalar_one())
            ]
            [fast_id] = await _insert(db, [_row(n=1)])
            assert fast_id > slow_id
            # The row written before the open transaction began is sealed; the later one waits.
            assert await AuditSealer(db).seal_pending() == 1
            assert await AuditSealer(db).seal_pending() == 0
            report = await _verify(db)
            assert (report.verified_rows, report.unsealed_rows) == (1, 1)  # the open row is not visible
            await slow.commit()
        assert await AuditSealer(db).seal_pending() == 2
        report = await _verify(db)
        assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 3, 0)
        async with db.connect() as conn:
            order = list((await conn.execute(
                sa.select(audit_links.c.audit_id).where(audit_links.c.tenant_id == "acme")
                .order_by(audit_links.c.chain_seq)
            )).scalars())
        assert order == [before, slow_id, fast_id]
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_a_transaction_open_in_another_database_does_not_hold_the_sealing_back(pg_url, empty_pg_url):
    import asyncpg

    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    other = await asyncpg.connect(empty_pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        async with other.transaction():
            await other.fetchval("SELECT pg_current_xact_id()")  # holds an id, like a long write
            await _insert(db, [_row(n=1)])
            assert await AuditSealer(db).seal_pending() == 1
        report = await _verify(db)
        assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 1, 0)
    finally:
        await other.close()
        await db.dispose()


@pytest.mark.postgres
async def test_concurrent_sealers_seal_every_row_exactly_once(pg_url):
    """Sealers racing without the turn (as if the lock were lost): the watermark, the heads and
    the links' keys let one win each batch; every row ends up sealed once."""
    from gateway.audit.sealer import ChainRaced, seal_batch
    from sqlalchemy import exc as sa_exc

    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        await _insert(db, [_row("acme" if i % 3 else "globex", n=i) for i in range(60)])

        async def racer() -> int:
            sealed = 0
            for _ in range(40):
                try:
                    async with db.begin() as conn:
                        sealed += (await seal_batch(conn, batch_size=7)).sealed
                except (ChainRaced, sa_exc.IntegrityError, sa_exc.DBAPIError):
                    pass
                await asyncio.sleep(0)
            return sealed

        totals = await asyncio.gather(*(racer() for _ in range(4)))
        assert sum(totals) == 60
        async with db.connect() as conn:
            assert await conn.scalar(sa.select(sa.func.count()).select_from(audit_links)) == 60
        for tenant, rows in (("acme", 40), ("globex", 20)):
            report = await _verify(db, tenant)
            assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, rows, 0)
    finally:
        await db.dispose()


async def test_a_sealer_that_loses_the_race_for_its_rows_rolls_back_and_the_next_round_seals_them(db, monkeypatch):
    import gateway.audit.sealer as sealer_module

    await _insert(db, [_row(n=i) for i in range(5)])
    real_horizon, raced = sealer_module.horizon, []

    async def another_sealer_wins_meanwhile(conn: AsyncConnection) -> int:
        below = await real_horizon(conn)
        if not raced:
            raced.append(True)
            async with db.begin() as other:  # it links the first rows this sealer is about to read
                await sealer_module.seal_batch(other, batch_size=3)
        return below

    monkeypatch.setattr(sealer_module, "horizon", another_sealer_wins_meanwhile)
    sealer = AuditSealer(db)
    assert await sealer.seal_once() == 0  # the lost race: rolled back, not raised
    assert raced
    assert await sealer.seal_pending() == 2
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 5, 0)


@pytest.mark.postgres
async def test_cli_verify_names_the_first_broken_row_and_counts_unsealed(pg_url):
    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        ids = await _insert(db, [_row(n=i) for i in range(4)])
        sealed = run_cli(pg_url, "audit", "seal")
        assert sealed.returncode == 0 and "sealed 4" in sealed.stdout
        await _insert(db, [_row(n=9)])
        ok = run_cli(pg_url, "audit", "verify", "--tenant", "acme")
        assert ok.returncode == 0, ok.stderr
        assert "OK, 4 sealed row(s) verified" in ok.stdout and "1 row(s) not sealed yet" in ok.stdout

        await _tamper(db, sa.update(audit_events).where(audit_events.c.id == ids[1]).values(outcome="X"))
        broken = run_cli(pg_url, "audit", "verify", "--tenant", "acme")
        assert broken.returncode == 1
        assert f"BROKEN at row id {ids[1]} (chain position 2)" in broken.stdout
        assert "1 row(s) not sealed yet" in broken.stdout
    finally:
        await db.dispose()


async def _rewrite_and_relink(db: Database, row_id: int, tenant: str = "acme", **values: Any) -> None:
    """What someone with the table owner's rights can do: switch the append-only triggers off,
    change a sealed row, then recompute its hashes, every later row's and the stored head with
    the chain's own functions."""
    from gateway.audit.chain import link_hash
    from gateway.audit.sealer import audit_chains

    async with _tampering(db) as conn:
        await conn.execute(sa.update(audit_events).where(audit_events.c.id == row_id).values(**values))
        start = await conn.scalar(sa.select(audit_links.c.chain_seq).where(audit_links.c.audit_id == row_id))
        prev = await conn.scalar(sa.select(audit_links.c.prev_hash).where(audit_links.c.audit_id == row_id))
        rows = (await conn.execute(
            sa.select(audit_events, audit_links.c.chain_seq)
            .join(audit_links, audit_links.c.audit_id == audit_events.c.id)
            .where(audit_links.c.tenant_id == tenant, audit_links.c.chain_seq >= start)
            .order_by(audit_links.c.chain_seq)
        )).all()
        for row in rows:
            content = content_hash(row)
            link = link_hash(row.chain_seq, prev, content, row.created_at)
            await conn.execute(sa.update(audit_links).where(audit_links.c.audit_id == row.id).values(
                content_hash=content, prev_hash=prev, chain_hash=link))
            prev = link
        await conn.execute(sa.update(audit_chains).where(audit_chains.c.tenant_id == tenant).values(head_hash=prev))


def _signed(pg_url: str, *args: str, key: str | None = None):  # type: ignore[no-untyped-def]
    from tests.support.tokens import SERVICE_SIGNING_KEY

    return run_cli(pg_url, "audit", *args, service_signing_key=key or SERVICE_SIGNING_KEY)


@pytest.mark.postgres
async def test_a_rewritten_and_relinked_chain_passes_verify_but_not_an_earlier_anchor(pg_url, tmp_path):
    import jwt

    from gateway.auth.service_tokens import ServiceTokenSigner
    from tests.support.tokens import SERVICE_SIGNING_KEY

    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    anchor_file = tmp_path / "acme.anchor"
    try:
        ids = await _insert(db, [_row(n=i) for i in range(6)])
        await AuditSealer(db).seal_pending()
        anchored = _signed(pg_url, "anchor", "--tenant", "acme", "--out", str(anchor_file))
        assert anchored.returncode == 0, anchored.stderr
        assert "anchored chain position 6" in anchored.stdout

        # The anchor is a JWS that the gateway's JWKS verifies, holding the head's position and hash.
        jwks = ServiceTokenSigner.from_pem(SERVICE_SIGNING_KEY.encode(), issuer="gateway", ttl_s=60).jwks()
        token = anchor_file.read_text().strip()
        key = jwt.PyJWKSet.from_dict(jwks)[jwt.get_unverified_header(token)["kid"]]
        claims = jwt.decode(token, key=key, algorithms=["ES256"], audience="gateway-audit-anchor")
        async with db.connect() as conn:
            head = await conn.scalar(sa.select(audit_links.c.chain_hash).where(audit_links.c.audit_id == ids[5]))
        assert (claims["tenant_id"], claims["chain_seq"], claims["chain_hash"]) == ("acme", 6, head)

        # Later rows, sealed and not yet sealed, leave the anchor valid.
        await _insert(db, [_row(n=i) for i in range(6, 9)])
        await AuditSealer(db).seal_pending()
        await _insert(db, [_row(n=9)])
        intact = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(anchor_file))
        assert intact.returncode == 0, intact.stdout + intact.stderr
        assert "OK, 9 sealed row(s) verified" in intact.stdout
        assert "unchanged up to the signed anchor at chain position 6" in intact.stdout
        assert "1 row(s) not sealed yet (the oldest written " in intact.stdout

        # Row 3 is rewritten and every later hash and the head recomputed.
        await _rewrite_and_relink(db, ids[2], outcome="OK", user_id="mallory")
        alone = run_cli(pg_url, "audit", "verify", "--tenant", "acme")
        assert alone.returncode == 0 and "OK, 9 sealed row(s) verified" in alone.stdout

        caught = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(anchor_file))
        assert caught.returncode == 1, caught.stdout + caught.stderr
        assert f"BROKEN at row id {ids[5]} (chain position 6)" in caught.stdout
        assert "signed anchor" in caught.stdout
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_an_anchor_that_is_altered_foreign_or_of_another_tenant_is_refused(pg_url, tmp_path):
    from gateway.auth.service_tokens import generate_signing_key_pem

    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        await _insert(db, [_row(n=i) for i in range(3)])
        await AuditSealer(db).seal_pending()
    finally:
        await db.dispose()
    anchor_file = tmp_path / "acme.anchor"
    assert _signed(pg_url, "anchor", "--tenant", "acme", "--out", str(anchor_file)).returncode == 0
    header, claims, signature = anchor_file.read_text().strip().split(".")

    import base64
    import json

    def b64(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    altered = tmp_path / "altered.anchor"
    altered.write_text(".".join([header, b64({**decoded, "chain_seq": 2}), signature]))
    result = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(altered))
    assert result.returncode == 1 and "signature does not verify" in result.stdout

    foreign = _signed(pg_url, "verify", "--tenant", "acme", "--anchor", str(anchor_file),
                      key=generate_signing_key_pem().decode())
    assert foreign.returncode == 1 and "not in the gateway's key set" in foreign.stdout

    other = _signed(pg_url, "verify", "--tenant", "globex", "--anchor", str(anchor_file))
    assert other.returncode == 1 and "anchors tenant 'acme', not 'globex'" in other.stdout

    unsigned = run_cli(pg_url, "audit", "anchor", "--tenant", "acme")
    assert unsigned.returncode == 2 and "GATEWAY_SERVICE_SIGNING_KEY" in unsigned.stderr


@pytest.mark.postgres
async def test_a_broken_chain_is_not_anchored(pg_url):
    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        ids = await _insert(db, [_row(n=i) for i in range(3)])
        await AuditSealer(db).seal_pending()
        await _tamper(db, sa.update(audit_events).where(audit_events.c.id == ids[1]).values(outcome="X"))
    finally:
        await db.dispose()
    refused = _signed(pg_url, "anchor", "--tenant", "acme")
    assert refused.returncode == 1
    assert refused.stdout == "" and f"BROKEN at row id {ids[1]}" in refused.stderr


@pytest.mark.postgres
async def test_an_anchor_at_the_pruned_boundary_still_verifies_and_one_pruned_past_is_refused(pg_url):
    from gateway.audit.anchor import Anchor

    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        old = months_ago(5)
        ids = await _insert(db, [_row(n=i, created_at=old + timedelta(seconds=i)) for i in range(4)])
        await _insert(db, [_row(n=i) for i in range(4, 6)])
        await AuditSealer(db).seal_pending()
        async with db.connect() as conn:
            hashes = {seq: link for seq, link in (await conn.execute(
                sa.select(audit_links.c.chain_seq, audit_links.c.chain_hash).where(audit_links.c.audit_id.in_(ids))
            )).all()}
        taken = datetime.now(UTC)
        at_boundary = Anchor(tenant_id="acme", chain_seq=4, chain_hash=hashes[4], issued_at=taken, key_id="k")
        pruned_past = Anchor(tenant_id="acme", chain_seq=2, chain_hash=hashes[2], issued_at=taken, key_id="k")

        await prune(db, older_than=parse_age("90d"))
        async with db.connect() as conn:
            kept = await verify_chain(conn, tenant_id="acme", anchor=at_boundary)
            gone = await verify_chain(conn, tenant_id="acme", anchor=pruned_past)
        assert kept.ok, kept.describe()
        assert not gone.ok
        assert "BROKEN at the signed anchor (chain position 2)" in gone.describe()
        assert "was pruned" in gone.describe()
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_cli_prune_drops_old_months_for_every_tenant_and_refuses_a_tenant_option(pg_url):
    await seeded(pg_url)
    db = Database.from_settings(Settings.from_flat(database_url=pg_url))
    try:
        old = months_ago(5)
        await _insert(db, [_row("acme", n=0, created_at=old), _row("globex", n=1, created_at=old), _row(n=2)])
    finally:
        await db.dispose()

    one_tenant = run_cli(pg_url, "audit", "prune", "--older-than", "90d", "--tenant", "acme")
    assert one_tenant.returncode == 2 and "takes no --tenant" in one_tenant.stderr
    assert "share monthly partitions" in one_tenant.stderr
    for bad in ("90", "-1d", "1y", "9" * 400 + "d"):
        refused = run_cli(pg_url, "audit", "prune", "--older-than", bad)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr

    pruned = run_cli(pg_url, "audit", "prune", "--older-than", "90d")
    assert pruned.returncode == 0, pruned.stderr
    assert "tenant acme: removed 1 row(s); the chain now starts after position 1" in pruned.stdout
    assert "tenant globex: removed 1 row(s); the chain now starts after position 1" in pruned.stdout
    assert f"dropped 1 month(s): audit_events_p{old:%Y_%m}" in pruned.stdout

    again = run_cli(pg_url, "audit", "prune", "--older-than", "90d")
    assert again.returncode == 0 and "nothing to prune" in again.stdout
    ok = run_cli(pg_url, "audit", "verify", "--tenant", "acme")
    assert ok.returncode == 0 and "OK, 2 sealed row(s) verified (chain positions 2..3)" in ok.stdout, ok.stdout  # the prune sealed the first prune's row
