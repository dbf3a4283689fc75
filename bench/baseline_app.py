"""The baseline the gateway is measured against: a bare Litestar endpoint on the same
server stack that decodes the HS256 JWT and inserts one row through raw asyncpg."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import jwt
from litestar import Litestar, Request, post
from litestar.exceptions import NotAuthorizedException

from bench.common import BASELINE_INSERT, BASELINE_TABLE

DSN = os.environ["BENCH_BASELINE_DSN"]
SECRET = os.environ["GATEWAY_JWT_SECRET"]


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Skip the pool's reset statement on release: the baseline gets every advantage."""


@asynccontextmanager
async def lifespan(app: Litestar) -> AsyncIterator[None]:
    app.state.pool = await asyncpg.create_pool(DSN, min_size=10, max_size=10, reset=_no_reset)
    async with app.state.pool.acquire() as conn:
        await conn.execute(BASELINE_TABLE)
    yield
    await app.state.pool.close()


@post("/v1/runs/{run_id:str}/tool-calls", status_code=200)
async def insert_one(request: Request, run_id: str) -> dict[str, str]:
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    try:
        claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    except jwt.PyJWTError:
        raise NotAuthorizedException() from None
    body = await request.body()
    async with request.app.state.pool.acquire() as conn:
        await conn.execute(
            BASELINE_INSERT,
            claims["tenant_id"], claims["sub"], body.decode(),
        )
    return {"status": "ok"}


app = Litestar([insert_one], lifespan=[lifespan], logging_config=None)
