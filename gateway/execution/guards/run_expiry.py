"""``RUN_EXPIRED``: a run's calls stop at its ``expires_at``. Decided by the admission
statement against the run's row (the first refusal there, after replays of known ids);
no per-call input."""

from __future__ import annotations

from gateway.errors import ErrorCode
from gateway.execution.guards.base import Guard, Stage
from gateway.execution.results import error_content

GUARD = Guard(
    name="run_expiry",
    stage=Stage.ADMISSION,
    code=ErrorCode.RUN_EXPIRED,
    contents={ErrorCode.RUN_EXPIRED.value: error_content(ErrorCode.RUN_EXPIRED)},
)
