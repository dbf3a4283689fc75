"""Log events never carry secrets, whatever the key's place in the event."""

from __future__ import annotations

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
