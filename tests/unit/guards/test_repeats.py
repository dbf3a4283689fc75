"""The ``repeats`` guard: REPEATED_CALL past max_repeats of the same call in a run, counted by the
statement per (run, call_hash) (tests/api/test_tool_calls_accounting.py); here, the identity it
gives: the tool and the canonical arguments."""

from __future__ import annotations

import json

from gateway.db.policies import DEFAULT_POLICY
from gateway.errors import ErrorCode
from gateway.execution.guards import ADMISSION_CONTENTS, admission_payload, repeats
from gateway.tools.base import call_hash
from tests.unit.guards.support import plan


def hashed(name: str, arguments: bytes) -> str | None:
    call = plan(name, arguments, decoded=True)
    repeats.prepare(call, DEFAULT_POLICY)
    return admission_payload(call)["call_hash"]


def test_the_same_call_written_differently_has_one_identity():
    assert hashed("add", b'{"a": 1, "b": 2}') == hashed("add", b'{ "b": 2, "a": 1 }') == call_hash("add", b'{"a":1,"b":2}')


def test_other_arguments_or_another_tool_are_another_call():
    assert hashed("add", b'{"a": 1, "b": 2}') != hashed("add", b'{"a": 2, "b": 1}')
    assert hashed("add", b'{"a": 1, "b": 2}') != hashed("multiply", b'{"a": 1, "b": 2}')


def test_its_answer_is_repeated_call():
    assert repeats.GUARD.code is ErrorCode.REPEATED_CALL
    assert json.loads(ADMISSION_CONTENTS["REPEATED_CALL"])["error"]["code"] == "REPEATED_CALL"
