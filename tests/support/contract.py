"""Schemathesis over a running gateway: every check, every phase (stateful links included),
a fixed seed and a bounded number of examples; failures come back as plain records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events, from_schema

SEED = 20261201
MAX_EXAMPLES = 12
STATEFUL_MAX_STEPS = 10


@dataclass(frozen=True)
class Failure:
    check: str
    operation: str
    title: str
    method: str
    path: str
    status: int | None
    body: str
    detail: str = ""

    def __str__(self) -> str:
        return (
            f"{self.check} on {self.operation} ({self.method} {self.path} -> {self.status}): {self.title}: "
            f"{self.detail[:300]!r}; answered {self.body[:300]}"
        )


@dataclass(frozen=True)
class ByDesign:
    """A failure docs/api.md names as by design: which check, on which operation, answered how."""

    check: str
    operation: str | None
    """None: every operation."""
    why: str
    answer_contains: str = ""

    def covers(self, failure: Failure) -> bool:
        return (
            failure.check == self.check
            and self.operation in (None, failure.operation)
            and self.answer_contains in failure.body
        )


@dataclass
class Report:
    cases: int
    failures: list[Failure]
    errors: list[str]

    def not_covered_by(self, by_design: list[ByDesign]) -> list[Failure]:
        return [f for f in self.failures if not any(reason.covers(f) for reason in by_design)]


def run_schemathesis(base_url: str, token: str, *, on_event: Callable[[object], None] | None = None) -> Report:
    config = SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "headers": {"Authorization": f"Bearer {token}"},
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none", "deterministic": True},
            "checks": {"enabled": True},
            "phases": {"stateful": {"max-steps": STATEFUL_MAX_STEPS}},
            "workers": 1,
            "request-timeout": 30,
        }
    )
    schema = schemathesis.openapi.from_url(f"{base_url}/schema/openapi.json", config=config)
    cases = 0
    failures: dict[tuple[str, str, str, str, int | None], Failure] = {}
    errors: list[str] = []
    for event in from_schema(schema).execute():
        if on_event is not None:
            on_event(event)
        if isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished):
            recorder = event.recorder
            cases += len(recorder.cases)
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.status.name != "FAILURE" or check.failure_info is None:
                        continue
                    case = recorder.cases[case_id].value
                    interaction = recorder.interactions.get(case_id)
                    response = interaction.response if interaction is not None else None
                    failure = Failure(
                        check=check.name,
                        operation=case.operation.label,
                        title=check.failure_info.failure.title,
                        method=case.method,
                        path=case.formatted_path,
                        status=response.status_code if response is not None else None,
                        body=response.content.decode("utf-8", "replace") if response is not None else "",
                        detail=check.failure_info.failure.message,
                    )
                    failures.setdefault(
                        (failure.check, failure.operation, failure.title, failure.method, failure.status), failure
                    )
        elif isinstance(event, events.NonFatalError | events.FatalError):
            errors.append(f"{type(event).__name__}: {getattr(event, 'info', None) or getattr(event, 'exception', '')}")
    return Report(cases=cases, failures=list(failures.values()), errors=errors)
