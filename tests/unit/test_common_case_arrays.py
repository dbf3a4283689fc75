"""The ledger's test for the common case (``_common_case_arrays``): every way a statement is
not plainly the common case sends it as JSON, and the arrays of one that is say what its JSON
says, call by call and run by run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from gateway.auth.principal import Principal
from gateway.execution.ledger import _AdmitItem, _common_case_arrays

ALICE = Principal("acme", "alice", frozenset(), frozenset())
BOB = Principal("acme", "bob", frozenset(), frozenset())
NOW = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)


def item(run_id: str, principal: Principal = ALICE, now: datetime = NOW) -> _AdmitItem:
    return _AdmitItem(principal, run_id, [], "req", now, now - timedelta(minutes=20), now + timedelta(hours=1), None)


def batch(it: _AdmitItem, *calls: dict[str, Any]) -> dict[str, Any]:
    return {
        "audit": {"tenant_id": it.principal.tenant_id, "user_id": it.principal.user_id, "run_id": it.run_id,
                  "request_id": it.request_id, "created_at": it.now.isoformat()},
        "calls": list(calls),
    }


def call(call_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "audit": {"tool_call_id": call_id, "tool": "add", "arguments": {"a": 1}, "arguments_sha256": "h" + call_id},
        "call_hash": "c" + call_id,
        "needs_approval": False,
        "approval_id": None,
        **extra,
    }


def test_plain_calls_become_arrays_in_the_statements_order_with_each_run_once() -> None:
    # The run's later request first: the statement keeps the batches' order.
    first, second, third = item("run_a", now=NOW + timedelta(seconds=1)), item("run_a"), item("run_b")
    result = {"outcome": "ok", "content": "3", "duration_ms": 0.5, "error_id": None}
    arrays = _common_case_arrays(
        [batch(first, call("1"), call("2", read_only=True)), batch(second, call("3", result=result)),
         batch(third, call("4"))],
        [first, second, third],
    )
    assert arrays is not None
    (batches, runs, ids, tools, sha, hashes, times, results, audits, read_only, run_ids, run_tenants, run_users) = arrays
    assert batches == [0, 0, 1, 2]
    assert runs == ["run_a", "run_a", "run_a", "run_b"]
    assert ids == ["1", "2", "3", "4"] and tools == ["add"] * 4
    assert sha == ["h1", "h2", "h3", "h4"] and hashes == ["c1", "c2", "c3", "c4"]
    assert times == [NOW + timedelta(seconds=1), NOW + timedelta(seconds=1), NOW, NOW]
    assert results[0] is None and msgspec.json.decode(results[2]) == result
    assert msgspec.json.decode(audits[2]) == {**batch(second)["audit"], **call("3")["audit"]}
    assert read_only is False  # one claim is read-only, the others not
    assert (run_ids, run_tenants, run_users) == (["run_a", "run_b"], ["acme", "acme"], ["alice", "alice"])


def test_a_statement_of_read_only_claims_says_so() -> None:
    it = item("run_a")
    arrays = _common_case_arrays([batch(it, call("1", read_only=True), call("2", read_only=True))], [it])
    assert arrays is not None and arrays[9] is True


@pytest.mark.parametrize("extra", [
    {"code": "PERMISSION_DENIED", "content": "no"},
    {"tool_cap": 3},
    {"needs_approval": True, "approval_id": "apr_1"},
    {"call_hash": None},
    {"some_new_guard": 1},
], ids=["refused", "tool-cap", "approval", "no-call-hash", "a-key-no-guard-here-knows"])
def test_a_call_that_is_not_plain_sends_the_statement_as_json(extra: dict[str, Any]) -> None:
    it = item("run_a")
    assert _common_case_arrays([batch(it, call("1"), call("2", **extra))], [it]) is None


def test_one_id_twice_in_a_run_sends_the_statement_as_json() -> None:
    one, two = item("run_a"), item("run_a")
    assert _common_case_arrays([batch(one, call("1")), batch(two, call("1"))], [one, two]) is None
    other = item("run_b")  # the same id in another run is another call
    assert _common_case_arrays([batch(one, call("1")), batch(other, call("1"))], [one, other]) is not None


def test_a_run_named_by_two_users_sends_the_statement_as_json() -> None:
    mine, theirs = item("run_a"), item("run_a", principal=BOB)
    assert _common_case_arrays([batch(mine, call("1")), batch(theirs, call("2"))], [mine, theirs]) is None


def test_a_call_without_an_id_or_a_request_without_an_owner_sends_the_statement_as_json() -> None:
    it = item("run_a")
    nameless = call("1")
    nameless["audit"]["tool_call_id"] = None
    assert _common_case_arrays([batch(it, nameless)], [it]) is None
    ownerless = item("run_a", principal=Principal("acme", None, frozenset(), frozenset()))  # type: ignore[arg-type]
    assert _common_case_arrays([batch(ownerless, call("1"))], [ownerless]) is None


def test_a_request_without_calls_or_a_time_without_zone_sends_the_statement_as_json() -> None:
    empty, plain = item("run_a"), item("run_b")
    assert _common_case_arrays([batch(empty), batch(plain, call("1"))], [empty, plain]) is None
    naive = item("run_a", now=NOW.replace(tzinfo=None))
    assert _common_case_arrays([batch(naive, call("1"))], [naive]) is None
