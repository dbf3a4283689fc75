"""Prometheus metrics: what the gateway counts, and the small API the rest of the code calls.

Metrics are process-wide by nature (one set of counters per process, one file per process
in multiprocess mode), so they live here at module level: the one deliberate exception
to "no module-level singletons". Nothing here does I/O on the request path.

Call sites use the functions, never the metric objects:

- ``call_answered(tool, decision, outcome, duration_ms)``: the executor answered one call
  (``tool_call_finished``, ``tool_call_replayed`` and ``approval_requested`` under it)
- ``approval_requested(tool)`` / ``approval_decided(decision)``: approvals
- ``rejected(code)``: a request or call refused by a guard (budget, permission, rate limit)
- ``http_error(code)``: an error envelope answered
- ``stages(timer)``: the stage times of one tool-call request (``Server-Timing``), added up
- ``model_call(model=..., duration_s=..., prompt_tokens=..., completion_tokens=..., outcome=...)``:
  one request to an upstream model (the agent loop)

Labels are bounded: a tool label is a registered tool's name (calls naming an unknown tool
count as ``_unknown``), outcomes and codes come from ``ErrorCode``.

With several worker processes, prometheus-client's multiprocess mode is used:
``PROMETHEUS_MULTIPROC_DIR`` must be set before this module is first imported (``gateway
serve --workers N`` does it), and ``/metrics`` then sums the files of every worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.observability.timing import STAGES, StageTimer

UNKNOWN_TOOL = "_unknown"

MULTIPROCESS = values.ValueClass is not values.MutexValue
"""Decided once, when prometheus-client is first imported, from ``PROMETHEUS_MULTIPROC_DIR``."""

disable_created_metrics()  # no *_created series: they double the series and nobody graphs them

REGISTRY = CollectorRegistry(auto_describe=True)
"""This process's metrics (single-process mode)."""

if not MULTIPROCESS:
    ProcessCollector(registry=REGISTRY)

_DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)

TOOL_CALLS = Counter(
    "gateway_tool_calls", "Guarded tool calls answered, by tool and outcome (replays excluded).",
    ["tool", "outcome"], registry=REGISTRY,
)
TOOL_CALL_REPLAYS = Counter(
    "gateway_tool_call_replays", "Tool calls answered from storage because their tool_call_id was known.",
    ["tool"], registry=REGISTRY,
)
TOOL_CALL_DURATION = Histogram(
    "gateway_tool_call_duration_seconds", "Execution time of the tool calls that ran, by tool.",
    ["tool"], buckets=_DURATION_BUCKETS, registry=REGISTRY,
)
STAGE_SECONDS = Counter(
    "gateway_stage_seconds", "Time spent in each stage of tool-call requests (see Server-Timing).",
    ["stage"], registry=REGISTRY,
)
TOOL_CALL_REQUESTS = Counter(
    "gateway_tool_call_requests", "Tool-call requests whose stages were timed.", registry=REGISTRY,
)
REJECTIONS = Counter(
    "gateway_rejections", "Requests and calls refused by a guard (budget, repeats, permission, rate limit).",
    ["code"], registry=REGISTRY,
)
HTTP_ERRORS = Counter(
    "gateway_http_errors", "HTTP error responses, by error code.", ["code"], registry=REGISTRY,
)
APPROVALS_REQUESTED = Counter(
    "gateway_approvals_requested", "Approvals created for calls of tools that change data.",
    ["tool"], registry=REGISTRY,
)
APPROVALS_DECIDED = Counter(
    "gateway_approvals_decided", "Approvals decided: approved, rejected or expired.",
    ["decision"], registry=REGISTRY,
)
MODEL_REQUEST_DURATION = Histogram(
    "gateway_model_request_duration_seconds", "Latency of requests to upstream models, by model and outcome.",
    ["model", "outcome"], buckets=_MODEL_BUCKETS, registry=REGISTRY,
)
MODEL_TOKENS = Counter(
    "gateway_model_tokens", "Tokens used by upstream models, by model and kind (prompt, completion).",
    ["model", "kind"], registry=REGISTRY,
)

REJECTION_CODES = frozenset(
    {"BUDGET_EXCEEDED", "REPEATED_CALL", "RUN_EXPIRED", "PERMISSION_DENIED", "FORBIDDEN", "RATE_LIMITED"}
)
"""Outcomes and HTTP codes that count as a guard's refusal."""

# Children by label values: ``labels()`` validates and locks on every call; a dict lookup does not.
_tool_calls: dict[tuple[str, str], object] = {}
_durations: dict[str, object] = {}
_rejections = {code: REJECTIONS.labels(code=code) for code in REJECTION_CODES}
_stage_children = tuple(STAGE_SECONDS.labels(stage=stage) for stage in STAGES)


def tool_call_finished(tool: str | None, outcome: str, duration_ms: float | None) -> None:
    """A guarded call was answered (not a replay). ``duration_ms`` is set for calls that ran."""
    name = tool or UNKNOWN_TOOL
    key = (name, outcome)
    child = _tool_calls.get(key)
    if child is None:
        child = _tool_calls[key] = TOOL_CALLS.labels(tool=name, outcome=outcome)
    child.inc()  # type: ignore[attr-defined]
    if duration_ms is not None:
        histogram = _durations.get(name)
        if histogram is None:
            histogram = _durations[name] = TOOL_CALL_DURATION.labels(tool=name)
        histogram.observe(duration_ms / 1000)  # type: ignore[attr-defined]
    rejection = _rejections.get(outcome)
    if rejection is not None:
        rejection.inc()


def call_answered(tool: str | None, decision: str, outcome: str, duration_ms: float | None) -> None:
    """The executor answered one call: ``decision`` is the ledger's (``execute``, ``decided``, ``replay``)."""
    if decision == "replay":
        tool_call_replayed(tool)
        return
    tool_call_finished(tool, outcome, duration_ms)
    if outcome == "APPROVAL_REQUIRED" and tool is not None:
        approval_requested(tool)


def tool_call_replayed(tool: str | None) -> None:
    TOOL_CALL_REPLAYS.labels(tool=tool or UNKNOWN_TOOL).inc()


def approval_requested(tool: str) -> None:
    APPROVALS_REQUESTED.labels(tool=tool).inc()


def approval_decided(decision: str) -> None:
    """``approved``, ``rejected`` or ``expired``."""
    APPROVALS_DECIDED.labels(decision=decision).inc()


def rejected(code: str) -> None:
    """A guard refused a request or call; ``code`` is its ErrorCode value."""
    child = _rejections.get(code)
    if child is not None:
        child.inc()


def http_error(code: str) -> None:
    """An HTTP error envelope was answered; guard refusals (FORBIDDEN, RATE_LIMITED) count as rejections too."""
    HTTP_ERRORS.labels(code=code).inc()
    rejected(code)


STAGE_FLUSH_EVERY = 64
_stage_pending = [0.0] * len(STAGES)
_stage_requests = 0


def stages(timer: StageTimer) -> None:
    """Add one tool-call request's stage times.

    Added up in the process and handed to Prometheus every ``STAGE_FLUSH_EVERY`` requests
    (and at every scrape of this process): seven locked counter increments per request
    cost more than the rest of this module's work on the hot path together.
    """
    global _stage_requests
    pending, spent = _stage_pending, timer.spent
    for index in range(len(pending)):
        pending[index] += spent[index]
    _stage_requests += 1
    if _stage_requests >= STAGE_FLUSH_EVERY:
        flush_stages()


def flush_stages() -> None:
    global _stage_requests
    for index, child in enumerate(_stage_children):
        child.inc(_stage_pending[index])
        _stage_pending[index] = 0.0
    TOOL_CALL_REQUESTS.inc(_stage_requests)
    _stage_requests = 0


def model_call(
    *,
    model: str,
    duration_s: float,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    outcome: str = "ok",
) -> None:
    """One request to an upstream model: its latency, and its token usage when the model reported it.

    ``outcome`` is a short, bounded word (``ok``, ``timeout``, ``error``, ``rate_limited``, ...);
    ``model`` is the configured model name, never text from a response.
    """
    MODEL_REQUEST_DURATION.labels(model=model, outcome=outcome).observe(duration_s)
    if prompt_tokens:
        MODEL_TOKENS.labels(model=model, kind="prompt").inc(prompt_tokens)
    if completion_tokens:
        MODEL_TOKENS.labels(model=model, kind="completion").inc(completion_tokens)


class _StateCollector:
    """Gauges read from the database at scrape time (identical in every process)."""

    def __init__(self, *, database_up: bool, pending: Mapping[str, int] | None, tenant_labels: bool) -> None:
        self._database_up = database_up
        self._pending = pending
        self._tenant_labels = tenant_labels

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gateway_database_up", "1 when the database answered this scrape.")
        up.add_metric([], 1.0 if self._database_up else 0.0)
        yield up
        if self._pending is None:
            return
        if not self._tenant_labels:
            total = GaugeMetricFamily("gateway_approvals_pending", "Approvals waiting for a decision.")
            total.add_metric([], float(sum(self._pending.values())))
            yield total
            return
        pending = GaugeMetricFamily(
            "gateway_approvals_pending", "Approvals waiting for a decision, by tenant.", labels=["tenant"]
        )
        for tenant, count in sorted(self._pending.items()):
            pending.add_metric([tenant], float(count))
        yield pending


def render(*, database_up: bool, pending_approvals: Mapping[str, int] | None, tenant_labels: bool = True) -> bytes:
    """The text exposition of every metric: this process's, or all workers' in multiprocess mode
    (where each worker's last few stage timings may still be waiting for their flush).
    ``tenant_labels=False`` sums the per-tenant gauges into one series."""
    flush_stages()
    registry = CollectorRegistry(auto_describe=False)
    if MULTIPROCESS:
        MultiProcessCollector(registry)
    else:
        registry.register(_Forward(REGISTRY))
    registry.register(
        _StateCollector(database_up=database_up, pending=pending_approvals, tenant_labels=tenant_labels)
    )
    return generate_latest(registry)


class _Forward:
    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        return self._source.collect()
