"""The guards of a tool call, composed in one list in the order the model sees their codes.

Before them, the batch as a whole must keep the protocol (``INVALID_TOOL_CALL``,
``DUPLICATE_TOOL_CALL_ID``: ``gateway.execution.protocol``), and the admission statement
answers a ``tool_call_id`` it already knows from storage (or ``TOOL_CALL_ID_CONFLICT``)
before any admission guard counts it. Then, per call:

==============  =========  ===================================================
guard           stage      code
==============  =========  ===================================================
exists          check      ``TOOL_NOT_FOUND``
permission      check      ``PERMISSION_DENIED``
arguments       check      ``INVALID_ARGUMENTS``
run_expiry      admission  ``RUN_EXPIRED``
budget          admission  ``BUDGET_EXCEEDED`` (the run's)
tool_budget     admission  ``BUDGET_EXCEEDED`` (the tool's per-run cap)
repeats         admission  ``REPEATED_CALL``
approval        admission  ``APPROVAL_REQUIRED``
timeout         execution  ``TOOL_TIMEOUT``
result_cap      execution  (a result cut to size, never refused)
==============  =========  ===================================================

The checks run in Python; the admission guards give their inputs to the one admission
statement of the batch (one round trip before anything runs, one after), which decides
them in the same order (``gateway_admit_calls``); the execution guards wrap the handler,
the first outermost. Adding a guard: its module here, its test file under
``tests/unit/guards/``, its place in ``GUARDS``, its code in ``gateway.errors`` (and, for
an admission guard, its part of the statement's SQL; a payload key it adds sends every
statement with such a call as JSON to that SQL unless ``gateway.execution.ledger``'s
``_PLAIN_CALL_KEYS`` lists it as one the common case's arrays may ignore).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.audit.rows import audit_json
from gateway.errors import ErrorCode
from gateway.execution.guards import (
    approval,
    arguments,
    budget,
    exists,
    permission,
    repeats,
    result_cap,
    run_expiry,
    timeout,
    tool_budget,
)
from gateway.execution.guards.base import Call, CheckContext, Guard, Stage
from gateway.execution.results import error_content

if TYPE_CHECKING:
    from gateway.execution.checks import CallPlan
    from gateway.execution.runner import CallOutcome

GUARDS: tuple[Guard, ...] = (
    exists.GUARD,
    permission.GUARD,
    arguments.GUARD,
    run_expiry.GUARD,
    budget.GUARD,
    tool_budget.GUARD,
    repeats.GUARD,
    approval.GUARD,
    timeout.GUARD,
    result_cap.GUARD,
)

# Precomputed once, so that a call walks plain tuples.
CHECKS = tuple((g.check, g.code, g.timed_as) for g in GUARDS if g.stage is Stage.CHECK and g.check is not None)
PREPARES = tuple(g.prepare for g in GUARDS if g.prepare is not None)
CONTRIBUTES = tuple(g.contribute for g in GUARDS if g.contribute is not None)

ADMISSION_CONTENTS: dict[str, str] = {
    ErrorCode.TOOL_CALL_ID_CONFLICT.value: error_content(ErrorCode.TOOL_CALL_ID_CONFLICT),
    **{key: content for g in GUARDS for key, content in g.contents.items()},
}
"""What the admission statement answers, by key, for each refusal it decides (``$3`` of
``gateway_admit_calls``): the admission guards' own, and a reused id's conflict."""


def admission_payload(plan: CallPlan, ran_ahead: CallOutcome | None = None) -> dict[str, Any]:
    """One call's part of the admission statement: what every call carries, then a refused
    call's stored answer, or each admission guard's inputs (and the outcome of a pure call
    that ran ahead, stored if it is admitted)."""
    payload: dict[str, Any] = {
        "audit": audit_json(
            tool_call_id=plan.id,
            tool=plan.request.name,
            arguments=plan.audit_arguments,
            arguments_sha256=plan.arguments_sha256,
        ),
    }
    if plan.rejected is not None:
        payload["code"] = plan.rejected.value
        payload["content"] = plan.rejection_content
    else:
        for contribute in CONTRIBUTES:
            contribute(plan, payload)
        if plan.tool is not None and not plan.tool.mutates and not plan.transactional:
            # Its claim may commit without waiting for the WAL flush (admit_calls.sql).
            payload["read_only"] = True
        if ran_ahead is not None:
            payload["result"] = {
                "outcome": ran_ahead.outcome,
                "content": ran_ahead.content,
                "duration_ms": ran_ahead.duration_ms,
                "error_id": ran_ahead.error_id,
            }
    return payload


def _handler(tool: Any, arguments: Any, ctx: Any) -> Any:
    return tool.handler(ctx, arguments)


def _compose() -> Call:
    call: Call = _handler
    for guard in reversed(GUARDS):
        if guard.around is not None:
            call = guard.around(call)
    return call


run_guarded: Call = _compose()
"""The handler inside the execution guards, the first of the list outermost; composed once.
Returns the call's ``content`` (an ``ok`` result, cut to size when too large)."""

__all__ = ["ADMISSION_CONTENTS", "CHECKS", "GUARDS", "PREPARES", "CheckContext", "Guard", "Stage",
           "admission_payload", "run_guarded"]
