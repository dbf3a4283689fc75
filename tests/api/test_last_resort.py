"""The last resort cannot fail: whatever an unexpected exception holds, the client gets the
envelope with INTERNAL_ERROR, a request id and an error id, and the log gets a readable stack
under that error id and the request id."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated

import pytest
import structlog
from litestar import Litestar, get
from litestar.params import PathParameter
from litestar.response import Stream
from litestar.testing import AsyncTestClient

from gateway.api.context import RequestContextMiddleware
from gateway.api.errors import exception_handlers
from gateway.logging import configure_logging, log_failure
from gateway.observability.metrics import Metrics
from tests.support.http import assert_error


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


def raise_failure(kind: str) -> None:
    if kind == "unprintable":
        raise UnprintableError()
    if kind == "surrogate":
        raise ValueError("the key \ud800 broke something \udfff")
    raise KeyError("plain")


@get("/boom/{kind:str}")
async def boom(kind: Annotated[str, PathParameter()]) -> None:
    raise_failure(kind)


@get("/stream")
async def broken_stream() -> Stream:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first line\n"
        raise_failure("surrogate")

    return Stream(chunks(), media_type="text/plain")


@pytest.fixture
async def failing_client() -> AsyncIterator[AsyncTestClient]:
    metrics = Metrics()
    app = Litestar(
        [boom, broken_stream], exception_handlers=exception_handlers(metrics), logging_config=None, debug=False  # type: ignore[arg-type]
    )
    app.asgi_handler = RequestContextMiddleware(app.asgi_handler, metrics=metrics)
    async with AsyncTestClient(app=app, raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("kind", ["unprintable", "surrogate", "plain"])
async def test_any_unexpected_exception_is_the_envelope_with_request_and_error_ids(failing_client, logs, kind):
    response = await failing_client.get(f"/boom/{kind}")
    error = assert_error(response, 500, "INTERNAL_ERROR")
    assert response.headers["content-type"].startswith("application/json")
    assert error["error_id"].startswith("err_") and error["message"] == "Internal error."
    (event,) = logs.named("unhandled_exception")
    assert event["error_id"] == error["error_id"] and event["request_id"] == error["request_id"]
    assert "Traceback" in event["exception"] and "raise_failure" in event["exception"]


async def test_a_stream_that_breaks_is_logged_with_its_stack_error_id_and_request_id(failing_client, logs):
    response = await failing_client.get("/stream")
    assert response.status_code == 200  # the status left before the stream broke
    (event,) = logs.named("request_failed")
    assert event["error_id"].startswith("err_") and event["request_id"] == response.headers["x-request-id"]
    assert event["response_started"] is True and "raise_failure" in event["exception"]


def test_logging_a_failure_never_raises_whatever_the_exception_holds(logs):
    for exc in (UnprintableError(), ValueError("\ud800"), KeyError("\x00")):
        log_failure("it_failed", exc, error_id="err_1")
    assert len(logs.named("it_failed")) == 3


@contextmanager
def production_logging() -> Iterator[None]:
    """The gateway's production logging (JSON lines on stderr), undone afterwards. Entered in
    the test itself: stderr is the test's capture only while the test runs."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("INFO", "json")
    try:
        yield
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)


def logged_lines(capture: pytest.CaptureFixture[str]) -> list[dict]:
    return [json.loads(line) for line in capture.readouterr().err.splitlines() if line.startswith("{")]


def test_a_failure_whose_text_utf8_cannot_encode_is_still_one_json_line_with_a_stack(capfd):
    with production_logging():
        try:
            raise_failure("surrogate")
        except ValueError as exc:
            log_failure("it_failed", exc, error_id="err_abc")
    (line,) = logged_lines(capfd)
    assert line["error_id"] == "err_abc" and "exc_info" not in line
    assert "Traceback" in line["exception"] and "\\ud800" in line["exception"]


def test_a_library_logging_an_exception_gets_an_error_id_and_a_readable_stack(capfd):
    with production_logging():
        try:
            raise_failure("plain")
        except KeyError as exc:
            logging.getLogger("uvicorn.error").error("Exception in ASGI application", exc_info=exc)
    (line,) = logged_lines(capfd)
    assert line["error_id"].startswith("err_")
    assert "exc_info" not in line and "Traceback" in line["exception"] and "raise_failure" in line["exception"]
