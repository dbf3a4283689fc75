"""Log events never carry secrets, whatever the key's place in the event."""

from __future__ import annotations

import asyncpg
import structlog

from gateway.logging import REDACTED, end_request_context, redact_secrets, start_request_context


def test_secret_keys_are_redacted():
    event = redact_secrets(None, "info", {"event": "x", "token": "eyJ.abc", "authorization": "Bearer t", "n": 1})
    assert event == {"event": "x", "token": REDACTED, "authorization": REDACTED, "n": 1}


def test_bound_request_fields_reach_every_event(logs):
    context = start_request_context(request_id="req_42")
    try:
        structlog.get_logger("t").info("something_happened", password="p4ss")
    finally:
        end_request_context(context)
    (event,) = logs.named("something_happened")
    assert event["request_id"] == "req_42" and event["password"] == REDACTED


async def test_a_driver_error_that_quotes_a_parameter_is_logged_without_it(pg_url, logs):
    """asyncpg names the value it could not encode in its own message, which SQLAlchemy's
    ``hide_parameters`` does not reach."""
    card = "4111" + "1111" * 3  # built here, so the stack's source lines do not show it
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    connection = await asyncpg.connect(dsn)
    try:
        try:
            await connection.fetchval("SELECT $1::text", f"card {card} \ud800")
        except asyncpg.DataError as exc:
            structlog.get_logger("t").error("query_failed", exc_info=exc)
    finally:
        await connection.close()
    (event,) = logs.named("query_failed")
    assert "invalid input for query argument $1: [value hidden]" in event["exception"]
    assert card not in event["exception"]
