"""Prometheus metrics: what the gateway counts, and the small API the rest of the code calls.

One ``Metrics`` object per app: ``create_app`` makes it and hands it to what records
(the executor, approvals, the model adapters, the request-context middleware, the HTTP
error handlers) and to ``/metrics``, so two apps in one process (tests) count apart.
Nothing here does I/O on the request path.

Call sites use the methods, never the metric objects:

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
``PROMETHEUS_MULTIPROC_DIR`` must be set before prometheus-client is first imported
(``gateway serve --workers N`` does it). Each worker runs one app, whose metrics write to
that worker's files, and ``/metrics`` then sums the files of every worker.
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

_DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)

REJECTION_CODES = frozenset(
    {"BUDGET_EXCEEDED", "REPEATED_CALL", "RUN_EXPIRED", "PERMISSION_DENIED", "FORBIDDEN", "RATE_LIMITED"}
)
"""Outcomes and HTTP codes that count as a guard's refusal."""

STAGE_FLUSH_EVERY = 64


class Metrics:
    """One app's counters and histograms, in a registry of their own (single-process mode) or
    in this worker's files (multiprocess mode)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        if not MULTIPROCESS:
            ProcessCollector(registry=registry)
        self._tool_calls = Counter(
            "gateway_tool_calls", "Guarded tool calls answered, by tool and outcome (replays excluded).",
            ["tool", "outcome"], registry=registry,
        )
        self._tool_call_replays = Counter(
            "gateway_tool_call_replays", "Tool calls answered from storage because their tool_call_id was known.",
            ["tool"], registry=registry,
        )
        self._tool_call_duration = Histogram(
            "gateway_tool_call_duration_seconds", "Execution time of the tool calls that ran, by tool.",
            ["tool"], buckets=_DURATION_BUCKETS, registry=registry,
        )
        stage_seconds = Counter(
            "gateway_stage_seconds", "Time spent in each stage of tool-call requests (see Server-Timing).",
            ["stage"], registry=registry,
        )
        self._tool_call_requests = Counter(
            "gateway_tool_call_requests", "Tool-call requests whose stages were timed.", registry=registry,
        )
        rejections = Counter(
            "gateway_rejections", "Requests and calls refused by a guard (budget, repeats, permission, rate limit).",
            ["code"], registry=registry,
        )
        self._http_errors = Counter(
            "gateway_http_errors", "HTTP error responses, by error code.", ["code"], registry=registry,
        )
        self._approvals_requested = Counter(
            "gateway_approvals_requested", "Approvals created for calls of tools that change data.",
            ["tool"], registry=registry,
        )
        self._approvals_decided = Counter(
            "gateway_approvals_decided", "Approvals decided: approved, rejected or expired.",
            ["decision"], registry=registry,
        )
        self._model_request_duration = Histogram(
            "gateway_model_request_duration_seconds", "Latency of requests to upstream models, by model and outcome.",
            ["model", "outcome"], buckets=_MODEL_BUCKETS, registry=registry,
        )
        self._model_tokens = Counter(
            "gateway_model_tokens", "Tokens used by upstream models, by model and kind (prompt, completion).",
            ["model", "kind"], registry=registry,
        )
        # Children by label values: ``labels()`` validates and locks on every call; a dict lookup does not.
        self._tool_call_children: dict[tuple[str, str], object] = {}
        self._duration_children: dict[str, object] = {}
        self._rejections = {code: rejections.labels(code=code) for code in REJECTION_CODES}
        self._stage_children = tuple(stage_seconds.labels(stage=stage) for stage in STAGES)
        self._stage_pending = [0.0] * len(STAGES)
        self._stage_requests = 0

    def tool_call_finished(self, tool: str | None, outcome: str, duration_ms: float | None) -> None:
        """A guarded call was answered (not a replay). ``duration_ms`` is set for calls that ran."""
        name = tool or UNKNOWN_TOOL
        key = (name, outcome)
        child = self._tool_call_children.get(key)
        if child is None:
            child = self._tool_call_children[key] = self._tool_calls.labels(tool=name, outcome=outcome)
        child.inc()  # type: ignore[attr-defined]
        if duration_ms is not None:
            histogram = self._duration_children.get(name)
            if histogram is None:
                histogram = self._duration_children[name] = self._tool_call_duration.labels(tool=name)
            histogram.observe(duration_ms / 1000)  # type: ignore[attr-defined]
        rejection = self._rejections.get(outcome)
        if rejection is not None:
            rejection.inc()

    def call_answered(self, tool: str | None, decision: str, outcome: str, duration_ms: float | None) -> None:
        """The executor answered one call: ``decision`` is the ledger's (``execute``, ``decided``, ``replay``)."""
        if decision == "replay":
            self.tool_call_replayed(tool)
            return
        self.tool_call_finished(tool, outcome, duration_ms)
        if outcome == "APPROVAL_REQUIRED" and tool is not None:
            self.approval_requested(tool)

    def tool_call_replayed(self, tool: str | None) -> None:
        self._tool_call_replays.labels(tool=tool or UNKNOWN_TOOL).inc()

    def approval_requested(self, tool: str) -> None:
        self._approvals_requested.labels(tool=tool).inc()

    def approval_decided(self, decision: str) -> None:
        """``approved``, ``rejected`` or ``expired``."""
        self._approvals_decided.labels(decision=decision).inc()

    def rejected(self, code: str) -> None:
        """A guard refused a request or call; ``code`` is its ErrorCode value."""
        child = self._rejections.get(code)
        if child is not None:
            child.inc()

    def http_error(self, code: str) -> None:
        """An HTTP error envelope was answered; guard refusals (FORBIDDEN, RATE_LIMITED) count as rejections too."""
        self._http_errors.labels(code=code).inc()
        self.rejected(code)

    def stages(self, timer: StageTimer) -> None:
        """Add one tool-call request's stage times.

        Added up here and handed to Prometheus every ``STAGE_FLUSH_EVERY`` requests (and at
        every scrape of this process): seven locked counter increments per request cost more
        than the rest of this class's work on the hot path together.
        """
        pending, spent = self._stage_pending, timer.spent
        for index in range(len(pending)):
            pending[index] += spent[index]
        self._stage_requests += 1
        if self._stage_requests >= STAGE_FLUSH_EVERY:
            self.flush_stages()

    def flush_stages(self) -> None:
        pending = self._stage_pending
        for index, child in enumerate(self._stage_children):
            child.inc(pending[index])
            pending[index] = 0.0
        self._tool_call_requests.inc(self._stage_requests)
        self._stage_requests = 0

    def model_call(
        self,
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
        self._model_request_duration.labels(model=model, outcome=outcome).observe(duration_s)
        if prompt_tokens:
            self._model_tokens.labels(model=model, kind="prompt").inc(prompt_tokens)
        if completion_tokens:
            self._model_tokens.labels(model=model, kind="completion").inc(completion_tokens)

    def render(
        self, *, database_up: bool, pending_approvals: Mapping[str, int] | None, tenant_labels: bool = True
    ) -> bytes:
        """The text exposition of every metric: this app's, or all workers' in multiprocess mode
        (where each worker's last few stage timings may still be waiting for their flush).
        ``tenant_labels=False`` sums the per-tenant gauges into one series."""
        self.flush_stages()
        registry = CollectorRegistry(auto_describe=False)
        if MULTIPROCESS:
            MultiProcessCollector(registry)
        else:
            registry.register(_Forward(self.registry))
        registry.register(
            _StateCollector(database_up=database_up, pending=pending_approvals, tenant_labels=tenant_labels)
        )
        return generate_latest(registry)


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


class _Forward:
    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        return self._source.collect()
