"""The articles service's own rules, through the tools: a tenant sees only its articles; only
the author or an editor may change or delete one (writes go through approvals)."""

from __future__ import annotations

import pytest

from gateway.demo import MEMBER
from gateway.db.tenants import ensure_role
from tests.support import db
from tests.support.approvals import approve, request_approval
from tests.support.calls import create_run, outcome, send_one
from tests.support.tokens import auth_for

ALICE, BOB = auth_for("alice"), auth_for("bob")
DAVE = auth_for("dave", roles=["writer"])  # may write, but not edit others' articles
ACME_ARTICLE = "art_demo_acme_1"  # written by bob
GLOBEX_ARTICLE = "art_demo_globex_1"


@pytest.fixture
async def writer_role(database_url):
    async with db.open_database(database_url) as database, database.begin() as conn:
        await ensure_role(conn, tenant_id="acme", name="writer", description="Writes their own articles.",
                          permissions=MEMBER | {"articles:write"})


async def run_approved(client, headers, call_id, tool, arguments) -> dict:
    """Request a write, have carol approve it, and return the call's stored outcome."""
    run = await create_run(client, headers)
    approval_id = await request_approval(client, run["id"], headers, call_id, tool, arguments)
    assert (await approve(client, approval_id)).status_code == 200
    return await send_one(client, run["id"], headers, call_id, tool, arguments)


async def test_get_article_reads_an_article_of_the_callers_tenant(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "get_article", {"article_id": ACME_ARTICLE})
    assert content["result"]["id"] == ACME_ARTICLE and "Acme Corporation" in content["result"]["body"]


async def test_another_tenants_article_is_not_found(client):
    run = await create_run(client, auth_for("alice", tenant="globex"))
    content = await send_one(client, run["id"], auth_for("alice", tenant="globex"), "c1", "get_article",
                             {"article_id": ACME_ARTICLE})
    assert outcome(content) == "NOT_FOUND"


async def test_search_finds_only_the_callers_tenants_articles(client):
    globex = auth_for("alice", tenant="globex")
    run = await create_run(client, globex)
    found = (await send_one(client, run["id"], globex, "c1", "search_articles", {"query": "policy"}))["result"]
    assert [a["id"] for a in found["articles"]] == ["art_demo_globex_2"]
    assert all("snippet" in a and "body" not in a for a in found["articles"])


async def test_search_treats_wildcards_literally(client):
    run = await create_run(client, ALICE)
    content = await send_one(client, run["id"], ALICE, "c1", "search_articles", {"query": "%"})
    assert content["result"] == {"articles": [], "count": 0}


async def test_the_author_may_change_their_article(client, database_url, writer_role):
    created = await run_approved(client, DAVE, "c1", "create_article", {"title": "Draft", "body": "v1"})
    article_id = created["result"]["id"]
    assert created["result"]["author_id"] == "dave"
    updated = await run_approved(client, DAVE, "c2", "update_article", {"article_id": article_id, "body": "v2"})
    assert updated["result"]["body"] == "v2" and updated["result"]["title"] == "Draft"


async def test_someone_else_who_is_not_an_editor_may_not_change_an_article(client, database_url, writer_role):
    content = await run_approved(client, DAVE, "c1", "update_article", {"article_id": ACME_ARTICLE, "title": "Mine now"})
    assert outcome(content) == "PERMISSION_DENIED"
    (article,) = await db.articles(database_url, id=ACME_ARTICLE)
    assert article.title != "Mine now"


async def test_someone_else_who_is_not_an_editor_may_not_delete_an_article(client, database_url, writer_role):
    content = await run_approved(client, DAVE, "c1", "delete_article", {"article_id": ACME_ARTICLE})
    assert outcome(content) == "PERMISSION_DENIED"
    assert len(await db.articles(database_url, id=ACME_ARTICLE)) == 1


async def test_an_editor_may_change_anyones_article(client, writer_role):
    created = await run_approved(client, DAVE, "c1", "create_article", {"title": "Dave's", "body": "text"})
    updated = await run_approved(
        client, BOB, "c2", "update_article", {"article_id": created["result"]["id"], "title": "Edited by bob"}
    )
    assert updated["result"]["title"] == "Edited by bob" and updated["result"]["author_id"] == "dave"


async def test_a_deleted_article_is_gone(client, database_url):
    deleted = await run_approved(client, BOB, "c1", "delete_article", {"article_id": ACME_ARTICLE})
    assert deleted["result"] == {"id": ACME_ARTICLE, "deleted": True}
    assert await db.articles(database_url, id=ACME_ARTICLE) == []


async def test_an_update_with_nothing_to_change_is_a_business_rule_violation(client):
    content = await run_approved(client, BOB, "c1", "update_article", {"article_id": ACME_ARTICLE})
    assert outcome(content) == "BUSINESS_RULE_VIOLATION"


async def test_another_tenants_article_cannot_be_changed(client, database_url):
    globex_bob, globex_carol = auth_for("bob", tenant="globex"), auth_for("carol", tenant="globex")
    run = await create_run(client, globex_bob)
    approval_id = await request_approval(
        client, run["id"], globex_bob, "c1", "delete_article", {"article_id": ACME_ARTICLE}
    )
    assert (await approve(client, approval_id, globex_carol)).status_code == 200
    content = await send_one(client, run["id"], globex_bob, "c1", "delete_article", {"article_id": ACME_ARTICLE})
    assert outcome(content) == "NOT_FOUND"
    assert len(await db.articles(database_url, id=ACME_ARTICLE)) == 1
    assert len(await db.articles(database_url, id=GLOBEX_ARTICLE)) == 1
