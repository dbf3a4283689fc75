"""Console sessions: a row in PostgreSQL per signed-in browser, found by the sha256 of the
random value its cookie holds (the value itself is never stored).

A session ends at its absolute limit (``expires_at``, set at sign-in), after the idle time
since it was last used, or on sign-out. Each use moves ``last_seen_at`` in the same
statement that checks both limits, so a session cannot be used past either of them.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from gateway.db.engine import Database
from gateway.db.models import ConsoleSession
from gateway.settings import ConsoleSettings

sessions = ConsoleSession.__table__

_VALUE = re.compile(r"^[A-Za-z0-9_-]{43}$")
"""What ``secrets.token_urlsafe(32)`` makes; anything else is no session (never a query)."""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def well_formed(value: str | None) -> bool:
    return value is not None and _VALUE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class ConsoleSessionRecord:
    tenant_id: str
    user_id: str
    roles: list[str]
    csrf_token: str
    expires_at: datetime


def _record(row: Any) -> ConsoleSessionRecord:
    return ConsoleSessionRecord(
        tenant_id=row.tenant_id, user_id=row.user_id, roles=list(row.roles), csrf_token=row.csrf_token,
        expires_at=row.expires_at,
    )


class SessionStore:
    def __init__(self, db: Database, settings: ConsoleSettings) -> None:
        self._db = db
        self._idle = timedelta(seconds=settings.session_idle_s)
        self._max = timedelta(seconds=settings.session_max_s)

    async def create(self, *, tenant_id: str, user_id: str, roles: list[str]) -> tuple[str, ConsoleSessionRecord]:
        """A new session; answers the cookie value (shown to the browser only) and the record.
        Sessions that ended are removed on the way."""
        value = new_secret()
        now = datetime.now(UTC)
        row = {
            "id_hash": digest(value),
            "tenant_id": tenant_id,
            "user_id": user_id,
            "roles": roles,
            "csrf_token": new_secret(),
            "created_at": now,
            "last_seen_at": now,
            "expires_at": now + self._max,
        }
        async with self._db.begin() as conn:
            await conn.execute(
                sa.delete(sessions).where(
                    sa.or_(sessions.c.expires_at <= now, sessions.c.last_seen_at <= now - self._idle)
                )
            )
            await conn.execute(sa.insert(sessions).values(**row))
        return value, ConsoleSessionRecord(
            tenant_id=tenant_id, user_id=user_id, roles=roles, csrf_token=row["csrf_token"],
            expires_at=row["expires_at"],
        )

    async def use(self, value: str | None) -> ConsoleSessionRecord | None:
        """The live session this cookie value names, marked as used now; ``None`` when there is
        none, it ended, or the value is not one this store could have made."""
        if not well_formed(value):
            return None
        assert value is not None
        now = datetime.now(UTC)
        async with self._db.begin() as conn:
            row = (
                await conn.execute(
                    sa.update(sessions)
                    .where(
                        sessions.c.id_hash == digest(value),
                        sessions.c.expires_at > now,
                        sessions.c.last_seen_at > now - self._idle,
                    )
                    .values(last_seen_at=now)
                    .returning(sessions)
                )
            ).first()
        return _record(row) if row is not None else None

    async def end(self, value: str | None) -> bool:
        if not well_formed(value):
            return False
        assert value is not None
        async with self._db.begin() as conn:
            result = await conn.execute(sa.delete(sessions).where(sessions.c.id_hash == digest(value)))
        return bool(result.rowcount)
