"""Articles: a tenant's knowledge base. The rules live here, not in the tools.

- A user sees only their tenant's articles (another tenant's article is simply not found).
- Only the author, or someone holding ``articles:edit_any`` (the ``editor`` role), may
  change or delete an article.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.auth.principal import Principal
from gateway.db.models import Article
from gateway.db.types import utcnow
from gateway.errors import ActionForbidden, BusinessRuleViolation, NotFoundError

EDIT_ANY = "articles:edit_any"
SNIPPET_CHARS = 200

articles = Article.__table__


def _view(row: Any, *, with_body: bool) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": row.id,
        "title": row.title,
        "author_id": row.author_id,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
    }
    if with_body:
        view["body"] = row.body
    else:
        view["snippet"] = row.body[:SNIPPET_CHARS]
    return view


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class ArticleService:
    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def search(self, principal: Principal, *, query: str, limit: int) -> list[dict[str, Any]]:
        pattern = f"%{_escape_like(query)}%"
        stmt = (
            sa.select(articles)
            .where(
                articles.c.tenant_id == principal.tenant_id,
                sa.or_(
                    articles.c.title.ilike(pattern, escape="\\"),
                    articles.c.body.ilike(pattern, escape="\\"),
                ),
            )
            .order_by(articles.c.created_at.desc(), articles.c.id)
            .limit(limit)
        )
        rows = (await self._conn.execute(stmt)).all()
        return [_view(row, with_body=False) for row in rows]

    async def get(self, principal: Principal, *, article_id: str) -> dict[str, Any]:
        return _view(await self._load(principal, article_id), with_body=True)

    async def create(self, principal: Principal, *, title: str, body: str) -> dict[str, Any]:
        now = utcnow()
        article_id = "art_" + uuid.uuid4().hex
        await self._conn.execute(
            sa.insert(articles).values(
                id=article_id,
                tenant_id=principal.tenant_id,
                author_id=principal.user_id,
                title=title,
                body=body,
                created_at=now,
                updated_at=now,
            )
        )
        return await self.get(principal, article_id=article_id)

    async def update(
        self, principal: Principal, *, article_id: str, title: str | None, body: str | None
    ) -> dict[str, Any]:
        if title is None and body is None:
            raise BusinessRuleViolation("Give a new title or body to change.")
        row = await self._load(principal, article_id)
        self._require_may_change(principal, row)
        changes: dict[str, Any] = {"updated_at": utcnow()}
        if title is not None:
            changes["title"] = title
        if body is not None:
            changes["body"] = body
        await self._conn.execute(
            sa.update(articles)
            .where(articles.c.tenant_id == principal.tenant_id, articles.c.id == article_id)
            .values(**changes)
        )
        return await self.get(principal, article_id=article_id)

    async def delete(self, principal: Principal, *, article_id: str) -> dict[str, Any]:
        row = await self._load(principal, article_id)
        self._require_may_change(principal, row)
        await self._conn.execute(
            sa.delete(articles).where(articles.c.tenant_id == principal.tenant_id, articles.c.id == article_id)
        )
        return {"id": article_id, "deleted": True}

    async def _load(self, principal: Principal, article_id: str) -> Any:
        row = (
            await self._conn.execute(
                sa.select(articles).where(articles.c.tenant_id == principal.tenant_id, articles.c.id == article_id)
            )
        ).first()
        if row is None:
            raise NotFoundError(f"No article with id {article_id!r}.")
        return row

    @staticmethod
    def _require_may_change(principal: Principal, row: Any) -> None:
        if row.author_id != principal.user_id and not principal.has(EDIT_ANY):
            raise ActionForbidden("Only the article's author or an editor may change or delete it.")
