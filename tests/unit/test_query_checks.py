"""The query checks run before any handler (gateway.api.decoding.check_request) read an
integer parameter by the key the query spells, its alias where it has one."""

from __future__ import annotations

from typing import Annotated

from litestar import Litestar, get
from litestar.params import QueryParameter
from litestar.testing import AsyncTestClient

from gateway.api.decoding import check_request
from gateway.api.errors import exception_handlers
from gateway.observability.metrics import Metrics


@get("/pages", sync_to_thread=False)
def pages(page_size: Annotated[int, QueryParameter(name="page-size")] = 10) -> int:
    return page_size


async def test_an_aliased_integer_parameter_is_checked_by_its_alias():
    app = Litestar([pages], before_request=check_request, exception_handlers=exception_handlers(Metrics()))  # type: ignore[arg-type]
    async with AsyncTestClient(app=app) as client:
        assert (await client.get("/pages?page-size=3")).json() == 3
        refused = await client.get("/pages?page-size=1e2")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "INVALID_REQUEST"
