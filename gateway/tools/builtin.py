"""The built-in tools. Each is a thin adapter: arguments in, a business service call, a result out."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gateway.services.articles import ArticleService
from gateway.services.calculator import MAX_SAFE_INTEGER, CalculatorService
from gateway.services.clock import ClockService
from gateway.text import refuse_line_breaks
from gateway.tools.base import Tool, ToolContext, struct_tool

ARTICLES_READ = "articles:read"
ARTICLES_WRITE = "articles:write"
CALCULATOR_USE = "calculator:use"
TIME_READ = "time:read"

ArticleId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$", description="The article's id.")
]
Title = Annotated[str, msgspec.Meta(min_length=1, max_length=200, description="The article's title.")]
Body = Annotated[str, msgspec.Meta(min_length=1, max_length=50_000, description="The article's text.")]
SafeInt = Annotated[int, msgspec.Meta(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]


class Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    pass


class SearchArticlesArgs(Strict):
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=200, description="Words to look for in titles and text.")]
    limit: Annotated[int, msgspec.Meta(ge=1, le=50, description="Most results to return.")] = 10


class ArticleRef(Strict):
    article_id: ArticleId

    def __post_init__(self) -> None:
        refuse_line_breaks(article_id=self.article_id)


class CreateArticleArgs(Strict):
    title: Title
    body: Body


class UpdateArticleArgs(Strict):
    article_id: ArticleId
    title: Title | None = None
    body: Body | None = None

    def __post_init__(self) -> None:
        refuse_line_breaks(article_id=self.article_id)


class TwoIntegers(Strict):
    a: Annotated[SafeInt, msgspec.Meta(description="The first integer.")]
    b: Annotated[SafeInt, msgspec.Meta(description="The second integer.")]


class NoArguments(Strict):
    pass


@struct_tool(
    name="search_articles",
    description="Search the knowledge base articles of your organisation by words in their title or text.",
    arguments=SearchArticlesArgs,
    permission=ARTICLES_READ,
)
async def search_articles(ctx: ToolContext, args: SearchArticlesArgs) -> object:
    async with ctx.connection() as conn:
        found = await ArticleService(conn).search(ctx.principal, query=args.query, limit=args.limit)
    return {"articles": found, "count": len(found)}


@struct_tool(
    name="get_article",
    description="Read one article, with its full text, by id.",
    arguments=ArticleRef,
    permission=ARTICLES_READ,
)
async def get_article(ctx: ToolContext, args: ArticleRef) -> object:
    async with ctx.connection() as conn:
        return await ArticleService(conn).get(ctx.principal, article_id=args.article_id)


@struct_tool(
    name="create_article",
    description="Create an article. It is written once an administrator approves the request.",
    arguments=CreateArticleArgs,
    permission=ARTICLES_WRITE,
    mutates=True,
)
async def create_article(ctx: ToolContext, args: CreateArticleArgs) -> object:
    async with ctx.write_transaction() as conn:
        return await ArticleService(conn).create(ctx.principal, title=args.title, body=args.body)


@struct_tool(
    name="update_article",
    description="Change the title and/or the text of an article. Needs an administrator's approval.",
    arguments=UpdateArticleArgs,
    permission=ARTICLES_WRITE,
    mutates=True,
)
async def update_article(ctx: ToolContext, args: UpdateArticleArgs) -> object:
    async with ctx.write_transaction() as conn:
        return await ArticleService(conn).update(
            ctx.principal, article_id=args.article_id, title=args.title, body=args.body
        )


@struct_tool(
    name="delete_article",
    description="Delete an article. Needs an administrator's approval.",
    arguments=ArticleRef,
    permission=ARTICLES_WRITE,
    mutates=True,
)
async def delete_article(ctx: ToolContext, args: ArticleRef) -> object:
    async with ctx.write_transaction() as conn:
        return await ArticleService(conn).delete(ctx.principal, article_id=args.article_id)




@struct_tool(
    name="add", description="Add two integers.", arguments=TwoIntegers, permission=CALCULATOR_USE, local=True
)
async def add(ctx: ToolContext, args: TwoIntegers) -> object:
    return CalculatorService().add(args.a, args.b)


@struct_tool(
    name="multiply",
    description="Multiply two integers.",
    arguments=TwoIntegers,
    permission=CALCULATOR_USE,
    local=True,
)
async def multiply(ctx: ToolContext, args: TwoIntegers) -> object:
    return CalculatorService().multiply(args.a, args.b)


@struct_tool(
    name="divide",
    description="Divide the integer a by the integer b. Dividing by zero is an error.",
    arguments=TwoIntegers,
    permission=CALCULATOR_USE,
    local=True,
)
async def divide(ctx: ToolContext, args: TwoIntegers) -> object:
    return CalculatorService().divide(args.a, args.b)




@struct_tool(
    name="get_current_time",
    description="The current date and time in UTC.",
    arguments=NoArguments,
    permission=TIME_READ,
    local=True,
)
async def get_current_time(ctx: ToolContext, args: NoArguments) -> object:
    return ClockService().current_time()


def builtin_tools() -> list[Tool]:
    return [
        search_articles,
        get_article,
        create_article,
        update_article,
        delete_article,
        add,
        multiply,
        divide,
        get_current_time,
    ]
