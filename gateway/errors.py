"""Every error code the gateway answers with, and the exception types that carry them.

This module is the single source of truth: the HTTP error envelope, the ``role=tool``
error results and the table in docs/errors.md are all derived from ``ERRORS``.

Codes are sorted by who must act:
- the model can fix its call (``INVALID_ARGUMENTS``, ``TOOL_NOT_FOUND``),
- the model must adapt (``PERMISSION_DENIED``, ``BUDGET_EXCEEDED``, ``REPEATED_CALL``),
- the model should wait (``APPROVAL_REQUIRED``),
- the model may retry (``retryable``: ``TOOL_TIMEOUT``, ...),
- or it is the gateway's fault (``TOOL_EXECUTION_FAILED``, ``INTERNAL_ERROR``), logged under an ``error_id``.

Messages are written for the model or the client and never contain the text of an
underlying exception.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Any


def new_error_id() -> str:
    """The id under which an internal error is logged; the caller gets only this id."""
    return "err_" + uuid.uuid4().hex[:20]


class ErrorCode(enum.StrEnum):
    # HTTP-level: authentication, routing, request shape
    UNAUTHENTICATED = "UNAUTHENTICATED"
    TENANT_DISABLED = "TENANT_DISABLED"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    INVALID_REQUEST = "INVALID_REQUEST"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
    INVALID_TOOL_CALL = "INVALID_TOOL_CALL"
    DUPLICATE_TOOL_CALL_ID = "DUPLICATE_TOOL_CALL_ID"
    ALREADY_DECIDED = "ALREADY_DECIDED"
    SELF_APPROVAL_FORBIDDEN = "SELF_APPROVAL_FORBIDDEN"
    RATE_LIMITED = "RATE_LIMITED"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    WEBHOOK_URL_REFUSED = "WEBHOOK_URL_REFUSED"

    # Tool results (role=tool), one per call
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    RUN_EXPIRED = "RUN_EXPIRED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    REPEATED_CALL = "REPEATED_CALL"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    APPROVAL_REJECTED = "APPROVAL_REJECTED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    TOOL_CALL_IN_PROGRESS = "TOOL_CALL_IN_PROGRESS"
    TOOL_CALL_ID_CONFLICT = "TOOL_CALL_ID_CONFLICT"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    TOOL_CALL_CANCELLED = "TOOL_CALL_CANCELLED"
    TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
    CONFLICT = "CONFLICT"
    BUSINESS_RULE_VIOLATION = "BUSINESS_RULE_VIOLATION"
    TOOL_EXECUTION_FAILED = "TOOL_EXECUTION_FAILED"

    # The agent loop: why a run stopped (still a 200 completion), and its model provider
    MAX_STEPS_EXCEEDED = "MAX_STEPS_EXCEEDED"
    TOKEN_BUDGET_EXCEEDED = "TOKEN_BUDGET_EXCEEDED"
    RUN_TIMEOUT = "RUN_TIMEOUT"
    CLIENT_TOOLS_NOT_ALLOWED = "CLIENT_TOOLS_NOT_ALLOWED"
    RUN_NOT_RESUMABLE = "RUN_NOT_RESUMABLE"
    MODEL_NOT_CONFIGURED = "MODEL_NOT_CONFIGURED"
    UPSTREAM_UNAVAILABLE = "UPSTREAM_UNAVAILABLE"
    UPSTREAM_TIMEOUT = "UPSTREAM_TIMEOUT"
    UPSTREAM_BAD_RESPONSE = "UPSTREAM_BAD_RESPONSE"
    UPSTREAM_REJECTED = "UPSTREAM_REJECTED"


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    code: ErrorCode
    status: int
    retryable: bool
    meaning: str
    message: str
    """The default safe message, used when the raiser gives none."""


def _spec(code: ErrorCode, status: int, retryable: bool, meaning: str, message: str) -> ErrorSpec:
    return ErrorSpec(code=code, status=status, retryable=retryable, meaning=meaning, message=message)


E = ErrorCode
ERRORS: dict[ErrorCode, ErrorSpec] = {
    spec.code: spec
    for spec in (
        _spec(E.UNAUTHENTICATED, 401, False,
              "The bearer token is missing, malformed, expired, badly signed or names an unknown tenant.",
              "Authentication required: send a valid bearer token."),
        _spec(E.TENANT_DISABLED, 403, False,
              "The token's tenant exists but has been disabled by an operator.",
              "This tenant is disabled."),
        _spec(E.FORBIDDEN, 403, False,
              "The caller is authenticated but lacks the permission this route needs.",
              "You do not have the permission this action needs."),
        _spec(E.NOT_FOUND, 404, False,
              "No such route, or no such resource in the caller's tenant (another tenant's resources are never revealed).",
              "Not found."),
        _spec(E.METHOD_NOT_ALLOWED, 405, False,
              "The route exists but not with this HTTP method.",
              "Method not allowed on this route."),
        _spec(E.INVALID_REQUEST, 400, False,
              "The request body or query parameters do not match the route's schema, or break the input rules "
              "(nesting deeper than GATEWAY_MAX_JSON_DEPTH, text PostgreSQL cannot store, a key given twice). Also "
              "the code of a `408` when a request's head does not arrive within GATEWAY_HEAD_TIMEOUT_S.",
              "The request is invalid."),
        _spec(E.PAYLOAD_TOO_LARGE, 413, False,
              "The request body is larger than GATEWAY_MAX_BODY_BYTES.",
              "The request body is too large."),
        _spec(E.HEADERS_TOO_LARGE, 431, False,
              "The request line and headers are larger than GATEWAY_MAX_HEAD_BYTES (the connection is closed).",
              "The request line and headers are too large."),
        _spec(E.INVALID_TOOL_CALL, 422, False,
              "A tool-call batch breaks the protocol (missing or empty id, type not `function`, empty name, "
              "arguments neither a string nor an object, a key given twice in one object, an unknown key at any "
              "level, nesting deeper than GATEWAY_MAX_JSON_DEPTH, text PostgreSQL cannot store, or a body that is "
              "not a JSON batch); nothing in the batch ran.",
              "The tool-call batch is malformed."),
        _spec(E.DUPLICATE_TOOL_CALL_ID, 422, False,
              "Two calls in one batch share a tool_call_id; nothing in the batch ran.",
              "Tool call ids must be unique within a batch."),
        _spec(E.ALREADY_DECIDED, 409, False,
              "The approval was already approved, rejected, or is being executed.",
              "This approval has already been decided."),
        _spec(E.WEBHOOK_URL_REFUSED, 400, False,
              "A webhook URL breaks the outbound rules: not `https` (unless its host is in "
              "GATEWAY_WEBHOOK_ALLOWED_HOSTS), credentials in it, or a loopback, private or otherwise "
              "non-public address that is not allow-listed.",
              "This webhook URL is not allowed."),
        _spec(E.SELF_APPROVAL_FORBIDDEN, 403, False,
              "An approver tried to approve their own request.",
              "You cannot approve your own request."),
        _spec(E.RATE_LIMITED, 429, True,
              "Too many requests for this tenant or user, too many audit exports at once, or the business service "
              "is rate limiting; retry later.",
              "Too many requests; retry later."),
        _spec(E.SERVICE_UNAVAILABLE, 503, True,
              "The gateway's database is unreachable; retry later.",
              "The service is temporarily unavailable; retry later."),
        _spec(E.INTERNAL_ERROR, 500, False,
              "An unexpected error in the gateway; it is logged under the returned error_id.",
              "Internal error."),
        _spec(E.TOOL_NOT_FOUND, 404, False,
              "The model named a tool that does not exist.",
              "No tool with this name exists."),
        _spec(E.PERMISSION_DENIED, 403, False,
              "The caller's roles do not grant this tool, or the business service refused the action for this user.",
              "You are not allowed to perform this action."),
        _spec(E.INVALID_ARGUMENTS, 422, False,
              "The arguments are not a JSON object matching the tool's schema exactly (no coercion, no unknown fields, "
              "no key given twice, no deeper than GATEWAY_MAX_JSON_DEPTH, only text PostgreSQL can store).",
              "The arguments do not match the tool's schema."),
        _spec(E.RUN_EXPIRED, 409, False,
              "The run has passed its expires_at; no further calls are accepted in it, and an approval of one of "
              "its calls decided after that expires with this outcome instead of running.",
              "This run has expired; start a new run."),
        _spec(E.BUDGET_EXCEEDED, 429, False,
              "The run has used its max_tool_calls.",
              "The tool-call budget of this run is used up."),
        _spec(E.REPEATED_CALL, 429, False,
              "The same tool with the same canonical arguments was called more than max_repeats times in this run.",
              "This exact call has been repeated too often in this run; use the earlier result or change the arguments."),
        _spec(E.APPROVAL_REQUIRED, 202, False,
              "The tool changes data and needs an administrator's approval; the result carries approval_id.",
              "This action needs an administrator's approval; it will run once approved."),
        _spec(E.APPROVAL_REJECTED, 409, False,
              "An administrator rejected the call.",
              "An administrator rejected this action."),
        _spec(E.APPROVAL_EXPIRED, 409, False,
              "Nobody decided the approval before it expired.",
              "The approval for this action expired before anyone decided it."),
        _spec(E.TOOL_CALL_IN_PROGRESS, 409, True,
              "A call with this tool_call_id is executing right now; ask again for its stored outcome.",
              "This call is still running; retry shortly to get its result."),
        _spec(E.TOOL_CALL_ID_CONFLICT, 409, False,
              "The run already used this tool_call_id for another call (another tool, or other canonical "
              "arguments); nothing ran. Only the same call under the same id is a replay.",
              "This tool_call_id was already used in this run for a different call; give each call its own id."),
        _spec(E.TOOL_TIMEOUT, 504, True,
              "The tool did not finish within its timeout and was cancelled.",
              "The tool did not answer in time."),
        _spec(E.TOOL_CALL_CANCELLED, 499, True,
              "The request carrying the call was cancelled (client gone, run deadline, shutdown) before the "
              "call finished; it may have had effects.",
              "The call was cancelled before it finished."),
        _spec(E.TOOL_OUTCOME_UNKNOWN, 500, False,
              "The call started long ago and its outcome was never recorded: the gateway process running it "
              "stopped. It may or may not have taken effect.",
              "This call's outcome is unknown: it was interrupted and may or may not have taken effect."),
        _spec(E.CONFLICT, 409, False,
              "The business service refused the change because of the current state of the data "
              "(HTTP: an admin change that conflicts with existing data, e.g. a role name already taken).",
              "The action conflicts with the current state."),
        _spec(E.BUSINESS_RULE_VIOLATION, 422, False,
              "The business service refused the request by one of its rules (dividing by zero is one).",
              "The request breaks a business rule."),
        _spec(E.TOOL_EXECUTION_FAILED, 500, True,
              "The tool failed unexpectedly; details are logged under error_id and never returned.",
              "The tool failed unexpectedly."),
        _spec(E.MAX_STEPS_EXCEEDED, 200, False,
              "The agent loop reached the run's max_steps (model round trips); the completion says so "
              "(finish_reason `length`).",
              "The run reached its limit of model rounds."),
        _spec(E.TOKEN_BUDGET_EXCEEDED, 200, False,
              "The run's model calls used more than max_total_tokens (input + output); the completion says so "
              "(finish_reason `length`).",
              "The run used up its token budget."),
        _spec(E.RUN_TIMEOUT, 200, False,
              "The run's wall-clock limit passed; the model request or tool in flight was cancelled "
              "(finish_reason `length`; also the result of a call cancelled that way).",
              "The run reached its time limit."),
        _spec(E.CLIENT_TOOLS_NOT_ALLOWED, 400, False,
              "The request brought its own `tools`, and the tenant does not allow client tools to pass through.",
              "This gateway supplies the tools: remove `tools` from the request."),
        _spec(E.RUN_NOT_RESUMABLE, 409, False,
              "Only an agent run stopped for an approval can be resumed, and only once at a time.",
              "This run is not waiting for an approval."),
        _spec(E.MODEL_NOT_CONFIGURED, 503, False,
              "No model provider is configured (GATEWAY_LLM_BASE_URL or GATEWAY_LLM_PROVIDERS), or the one this "
              "run or tenant needs is gone.",
              "No model provider is configured for this request."),
        _spec(E.UPSTREAM_UNAVAILABLE, 502, True,
              "The model provider refused connections or answered 5xx/429 on every retry within the run's deadline.",
              "The model provider is unavailable; retry later."),
        _spec(E.UPSTREAM_TIMEOUT, 504, True,
              "The model provider did not answer within GATEWAY_LLM_TIMEOUT_S on every retry.",
              "The model provider did not answer in time; retry later."),
        _spec(E.UPSTREAM_BAD_RESPONSE, 502, False,
              "The model provider answered something that is not a chat completion (malformed JSON, no message, "
              "a tool call without a name, or a body over the size limit).",
              "The model provider answered with a malformed response."),
        _spec(E.UPSTREAM_REJECTED, 502, False,
              "The model provider refused the request with a 4xx other than 429 (unknown model, a prompt it "
              "cannot take, or the gateway's credentials for it); details are logged.",
              "The model provider refused the request."),
    )
}


TOOL_RESULT_CODES = frozenset(
    {
        E.TOOL_NOT_FOUND, E.PERMISSION_DENIED, E.INVALID_ARGUMENTS, E.RUN_EXPIRED, E.BUDGET_EXCEEDED,
        E.REPEATED_CALL, E.APPROVAL_REQUIRED, E.APPROVAL_REJECTED, E.APPROVAL_EXPIRED, E.TOOL_CALL_IN_PROGRESS,
        E.TOOL_CALL_ID_CONFLICT,
        E.TOOL_TIMEOUT, E.TOOL_CALL_CANCELLED, E.TOOL_OUTCOME_UNKNOWN, E.CONFLICT, E.BUSINESS_RULE_VIOLATION, E.TOOL_EXECUTION_FAILED, E.NOT_FOUND,
        E.RATE_LIMITED,
    }
)
"""Codes that reach the model as a ``role=tool`` result (some are HTTP answers as well)."""


def markdown_table() -> str:
    """The error-code table of docs/errors.md, generated from ``ERRORS``."""
    lines = ["| code | HTTP status | retryable | meaning |", "|---|---|---|---|"]
    for spec in ERRORS.values():
        if spec.code in TOOL_RESULT_CODES:
            status = f"{spec.status} / tool result" if spec.code in _ALSO_HTTP else "tool result"
        elif spec.code in STOP_REASON_CODES:
            status = "200, stop reason"
        else:
            status = str(spec.status)
        lines.append(f"| `{spec.code}` | {status} | {'yes' if spec.retryable else 'no'} | {spec.meaning} |")
    return "\n".join(lines)


_ALSO_HTTP = frozenset({E.NOT_FOUND, E.RATE_LIMITED, E.CONFLICT, E.RUN_EXPIRED, E.APPROVAL_EXPIRED})

STOP_REASON_CODES = frozenset({E.MAX_STEPS_EXCEEDED, E.TOKEN_BUDGET_EXCEEDED, E.RUN_TIMEOUT})
"""Codes that end an agent run inside a normal ``200`` completion, as its ``gateway.stop_reason``."""


class GatewayError(Exception):
    """An error answered to an HTTP client in the JSON envelope."""

    def __init__(
        self,
        code: ErrorCode,
        message: str | None = None,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        spec = ERRORS[code]
        self.code = code
        self.message = message or spec.message
        self.status = status or spec.status
        self.headers = headers or {}
        self.extra = extra or {}
        super().__init__(f"{code}: {self.message}")


class ToolError(Exception):
    """A business error raised by a tool or service: the model may read ``message``.

    Only codes the model can act on belong here; anything else is an unexpected failure
    and must simply raise.
    """

    def __init__(
        self, code: ErrorCode, message: str, *, retryable: bool | None = None, error_id: str | None = None
    ) -> None:
        self.code = code
        self.message = message
        self.retryable = ERRORS[code].retryable if retryable is None else retryable
        self.error_id = error_id
        """Set when the details were logged under this id (an upstream failure): the model gets the id."""
        super().__init__(f"{code}: {message}")


class NotFoundError(ToolError):
    def __init__(self, message: str = "Not found.") -> None:
        super().__init__(ErrorCode.NOT_FOUND, message)


class ConflictError(ToolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CONFLICT, message)


class BusinessRuleViolation(ToolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.BUSINESS_RULE_VIOLATION, message)


class ActionForbidden(ToolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.PERMISSION_DENIED, message)
