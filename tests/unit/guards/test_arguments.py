"""The ``arguments`` guard: INVALID_ARGUMENTS unless the arguments decode strictly."""

from __future__ import annotations

from gateway.errors import ErrorCode
from gateway.execution.guards import arguments
from tests.unit.guards.support import EDITOR_PRINCIPAL, context, plan


def test_arguments_of_the_wrong_type_are_refused_naming_the_field():
    refusal = arguments.check(plan("add", b'{"a": "5", "b": 1}'), context())
    assert refusal is not None and refusal.startswith("Invalid arguments for 'add': ") and "`a`" in refusal
    assert arguments.GUARD.code is ErrorCode.INVALID_ARGUMENTS


def test_an_identity_field_is_an_unknown_field():
    refusal = arguments.check(
        plan("create_article", b'{"title": "t", "body": "b", "tenant_id": "globex"}'), context(EDITOR_PRINCIPAL)
    )
    assert refusal is not None and "`tenant_id`" in refusal


def test_arguments_nested_deeper_than_the_limit_are_refused():
    deep = b'{"a": 1, "b": ' + b"[" * 10 + b"2" + b"]" * 10 + b"}"
    assert arguments.check(plan("add", deep), context(max_json_depth=5)) is not None


def test_a_key_given_twice_is_refused():
    assert arguments.check(plan("add", b'{"a": 1, "a": 2, "b": 3}'), context()) is not None


def test_valid_arguments_pass_and_are_put_on_the_plan_canonically():
    checked = plan("add", b'{"b": 2, "a": 1}')
    assert arguments.check(checked, context()) is None
    assert checked.arguments is not None and checked.arguments.canonical == b'{"a":1,"b":2}'
