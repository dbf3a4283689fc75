"""An approval freezes the call's canonical arguments as text: the approver sees them, their
sha256 is of that text, and the approved call executes exactly that value — numbers JSONB
would rewrite and unicode in every spelling included. PostgreSQL."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import msgspec
import pytest

from tests.support import db
from tests.support.approvals import CAROL, approve
from tests.support.calls import create_run, send, tool_call
from tests.support.tokens import auth_for

pytestmark = pytest.mark.probe_tools

BOB = auth_for("bob")

# (raw `value` as the model wrote it, the value the handler must see, the frozen canonical text)
AWKWARD_VALUES = [
    pytest.param("1e16", 1e16, '{"value":1e16}', id="1e16"),
    pytest.param("-0.0", -0.0, '{"value":-0.0}', id="negative-zero"),
    pytest.param("1.0", 1.0, '{"value":1.0}', id="one-point-zero"),
    pytest.param("12345678901234567890", 12345678901234567890, '{"value":12345678901234567890}', id="big-int"),
    pytest.param("1e-7", 1e-7, '{"value":1e-7}', id="1e-7"),
    pytest.param('"caf\u00e9"', "caf\u00e9", '{"value":"caf\u00e9"}', id="nfc-raw"),
    pytest.param('"cafe\u0301"', "cafe\u0301", '{"value":"cafe\u0301"}', id="nfd-raw"),
    pytest.param('"caf\\u00e9"', "caf\u00e9", '{"value":"caf\u00e9"}', id="nfc-escaped"),
    pytest.param('"cafe\\u0301"', "cafe\u0301", '{"value":"cafe\u0301"}', id="nfd-escaped"),
    pytest.param('"\\ud83d\\ude00 \\"q\\" \\\\"', '\U0001f600 "q" \\', '{"value":"\U0001f600 \\"q\\" \\\\"}',
                 id="escaped-astral-and-quotes"),
]


def exactly(seen: Any, expected: Any) -> bool:
    """Equal, of the same type, and spelled the same (``-0.0`` is not ``0.0``, ``1.0`` not ``1``)."""
    return type(seen) is type(expected) and seen == expected and repr(seen) == repr(expected)


async def request_keep(client, run_id: str, call_id: str, raw_value: str) -> str:
    (content,) = await send(client, run_id, BOB, tool_call("keep_value", call_id=call_id, raw=f'{{"value": {raw_value}}}'))
    assert content["ok"] is False and content["error"]["code"] == "APPROVAL_REQUIRED", content
    return str(content["error"]["approval_id"])


@pytest.mark.parametrize(("raw_value", "expected", "canonical"), AWKWARD_VALUES)
async def test_an_approved_call_executes_exactly_the_frozen_value(
    pg_client, seeded_pg_url, probe, raw_value, expected, canonical
):
    run = await create_run(pg_client, BOB)
    approval_id = await request_keep(pg_client, run["id"], "call_1", raw_value)

    (row,) = await db.approvals(seeded_pg_url, id=approval_id)
    assert row.canonical_arguments == canonical
    assert row.arguments_sha256 == hashlib.sha256(canonical.encode()).hexdigest()

    response = await approve(pg_client, approval_id)
    assert response.status_code == 200, response.text
    view = response.json()
    assert (view["status"], view["outcome"]["code"]) == ("succeeded", "OK"), view
    assert probe.executions == {"call_1": 1}
    assert exactly(probe.values["call_1"], expected), (probe.values["call_1"], expected)


@pytest.mark.parametrize(("raw_value", "expected", "canonical"), AWKWARD_VALUES)
async def test_the_approver_sees_exactly_the_value_that_will_execute(
    pg_client, probe, raw_value, expected, canonical
):
    run = await create_run(pg_client, BOB)
    approval_id = await request_keep(pg_client, run["id"], "call_1", raw_value)
    response = await pg_client.get(f"/v1/admin/approvals/{approval_id}", headers=CAROL)
    assert response.status_code == 200, response.text
    view = msgspec.json.decode(response.content)
    assert exactly(view["arguments"]["value"], expected)
    # What the approver is shown re-encodes to the very text that was hashed.
    shown = msgspec.json.encode(view["arguments"], order="sorted")
    assert shown == canonical.encode() and hashlib.sha256(shown).hexdigest() == view["arguments_sha256"]
    assert probe.executions == {}


async def test_a_negative_zero_is_not_a_zero(pg_client, probe):
    """The two spellings are different calls with different approvals, each executed as written."""
    run = await create_run(pg_client, BOB)
    negative = await request_keep(pg_client, run["id"], "neg", "-0.0")
    positive = await request_keep(pg_client, run["id"], "pos", "0.0")
    assert negative != positive
    for approval_id in (negative, positive):
        assert (await approve(pg_client, approval_id)).json()["status"] == "succeeded"
    assert math.copysign(1.0, probe.values["neg"]) == -1.0 and math.copysign(1.0, probe.values["pos"]) == 1.0
