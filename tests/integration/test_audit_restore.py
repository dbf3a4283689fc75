"""A database restored into another PostgreSQL cluster (``pg_dump``) keeps the old cluster's
transaction ids in ``audit_events.txid`` and the sealer's watermark, while its new transactions
may get lower ones: new rows are still sealed, rows sealed before are not linked twice, and
``audit verify`` raises no false alarm. PostgreSQL."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import asyncpg
import pytest
import sqlalchemy as sa

from gateway.audit.chain import audit_links
from gateway.audit.sealer import AuditSealer, audit_seal_state
from gateway.db.embedded import EmbeddedPostgres, bin_dir
from gateway.db.engine import Database
from gateway.settings import Settings
from tests.conftest import seeded
from tests.integration.test_audit_chain import _insert, _row, _tampering, _verify
from tests.support.postgres import remove_embedded, start_embedded

AHEAD = 1000
"""How far ahead of this cluster's transaction ids the simulated old cluster's were."""


async def _current_txid(db: Database) -> int:
    async with db.begin() as conn:
        return int(await conn.scalar(sa.text("SELECT pg_current_xact_id()::text::bigint")))


async def _spend_txids_past(dsn: str, txid: int) -> None:
    """Run transactions until this cluster's next transaction id is past ``txid``."""
    conn = await asyncpg.connect(dsn)
    try:
        while int(await conn.fetchval("SELECT pg_current_xact_id()::text::bigint")) <= txid:
            pass
    finally:
        await conn.close()


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _chain_order(db: Database) -> list[int]:
    async with db.connect() as conn:
        return list((await conn.execute(
            sa.select(audit_links.c.audit_id).where(audit_links.c.tenant_id == "acme").order_by(audit_links.c.chain_seq)
        )).scalars())


async def test_rows_written_after_a_restore_from_a_cluster_further_ahead_are_sealed(db, pg_url):
    """What a restore leaves, made in place: the rows and the watermark carry transaction ids
    ahead of this cluster's, the watermark row written by a transaction of this one."""
    old = await _insert(db, [_row(n=i) for i in range(5)])
    assert await AuditSealer(db).seal_pending() == 5
    [old_unsealed] = await _insert(db, [_row(n=5)])
    async with _tampering(db) as conn:
        await conn.execute(sa.text(f"UPDATE audit_events SET txid = txid + {AHEAD}"))
        await conn.execute(sa.update(audit_seal_state).values(txid=audit_seal_state.c.txid + AHEAD))

    new = await _insert(db, [_row(n=i) for i in range(6, 8)])
    assert await AuditSealer(db).seal_pending() == 2
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 7, 1), report.describe()

    # Once this cluster's ids pass the old ones, the old rows are read again: those with a
    # link are passed over, the one the old cluster had not sealed is sealed.
    async with db.connect() as conn:
        highest = int(await conn.scalar(sa.text("SELECT max(txid) FROM audit_events")))
    await _spend_txids_past(_dsn(pg_url), highest)
    assert await AuditSealer(db).seal_pending() == 1
    report = await _verify(db)
    assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 8, 0), report.describe()
    assert await _chain_order(db) == [*old, *new, old_unsealed]


@pytest.fixture
def other_cluster() -> Iterator[EmbeddedPostgres]:
    """A second, new PostgreSQL cluster (the embedded one, on a socket of its own)."""
    cluster = start_embedded()
    try:
        yield cluster
    finally:
        remove_embedded(cluster)


def _pg_tool(name: str, *args: str) -> None:
    done = subprocess.run([str(bin_dir() / name), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.postgres
async def test_a_database_restored_into_a_new_cluster_keeps_sealing(pg_url, other_cluster, tmp_path):
    await seeded(pg_url)
    source = Database.from_settings(Settings.from_flat(database_url=pg_url))
    target_url = other_cluster.url()
    try:
        # The new cluster's transaction ids must be behind the old one's watermark, as a new
        # cluster's are behind a busy one's.
        target_ids = await asyncpg.connect(_dsn(target_url))
        try:
            target_txid = int(await target_ids.fetchval("SELECT pg_current_xact_id()::text::bigint"))
        finally:
            await target_ids.close()
        await _spend_txids_past(_dsn(pg_url), target_txid + 2000)
        old = await _insert(source, [_row(n=i) for i in range(4)])
        assert await AuditSealer(source).seal_pending() == 4
        [old_unsealed] = await _insert(source, [_row(n=4)])
    finally:
        await source.dispose()

    dump = tmp_path / "gateway.sql"
    _pg_tool("pg_dump", "--no-owner", f"--file={dump}", _dsn(pg_url))
    # Some servers stamp column options of their own, which a stock server refuses.
    dump.write_text("".join(line for line in dump.read_text().splitlines(keepends=True) if "(pg_attver=" not in line))
    _pg_tool("psql", "--quiet", "--single-transaction", "--set=ON_ERROR_STOP=1", f"--dbname={other_cluster.dsn()}",
             f"--file={dump}")

    restored = Database.from_settings(Settings.from_flat(database_url=target_url))
    try:
        async with restored.connect() as conn:
            mark = int(await conn.scalar(sa.select(audit_seal_state.c.txid)))
        assert await _current_txid(restored) < mark  # the restore's effect under test
        new = await _insert(restored, [_row(n=i) for i in range(5, 8)])
        assert await AuditSealer(restored).seal_pending() == 3
        report = await _verify(restored)
        assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 7, 1), report.describe()

        await _spend_txids_past(_dsn(target_url), mark + 10)
        assert await AuditSealer(restored).seal_pending() == 1
        report = await _verify(restored)
        assert (report.ok, report.verified_rows, report.unsealed_rows) == (True, 8, 0), report.describe()
        assert await _chain_order(restored) == [*old, *new, old_unsealed]
    finally:
        await restored.dispose()
