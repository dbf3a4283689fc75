"""The API contract, checked by schemathesis against a real `gateway serve` process.

Every check and phase (examples, coverage, fuzzing, stateful with the document's links),
as an administrator and as a member, a fixed seed and a bounded number of examples. A
failure passes only where the by-design list in docs/api.md names it; nothing else is waived.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.contract import ByDesign, run_schemathesis
from tests.support.loopback import ServerThread
from tests.support.processes import gateways
from tests.support.scripted_model import ScriptedModel, openai_turn
from tests.support.tokens import make_token

pytestmark = pytest.mark.postgres

BY_DESIGN = [
    ByDesign(
        "positive_data_acceptance",
        None,
        "an integer is written without a fraction (`5`, not `5.0`); JSON Schema's `integer` cannot tell them apart",
        answer_contains="got `float`",
    ),
    ByDesign(
        "use_after_free",
        "GET /v1/admin/tools/{tool}",
        "DELETE on a tool's policy puts the default policy back; the tool itself cannot be deleted",
    ),
    ByDesign(
        "positive_data_acceptance",
        "POST /v1/runs",
        "expires_at must lie in the future, a rule relative to the clock that no schema can state",
        answer_contains="expires_at must be in the future",
    ),
    ByDesign(
        "positive_data_acceptance",
        "GET /v1/admin/approvals",
        "a cursor is opaque: only one this API gave out is accepted",
        answer_contains="The cursor is not one this API gave out",
    ),
    ByDesign(
        "positive_data_acceptance",
        "GET /v1/admin/audit",
        "a cursor is opaque: only one this API gave out is accepted",
        answer_contains="The cursor is not one this API gave out",
    ),
    ByDesign(
        "positive_data_acceptance",
        "POST /v1/chat/completions",
        "whether a request may bring its own tools is the tenant's setting (the demo tenant refuses them)",
        answer_contains="CLIENT_TOOLS_NOT_ALLOWED",
    ),
    ByDesign(
        "positive_data_acceptance",
        "POST /v1/chat/completions",
        "a conversation's order is a rule across messages: a tool message answers a call of the assistant message "
        "before it",
        answer_contains="Invalid conversation",
    ),
    ByDesign(
        "positive_data_acceptance",
        "POST /v1/runs/{run_id}/tool-calls",
        "the calls of one batch need distinct ids, a rule across items that JSON Schema's uniqueItems cannot state "
        "(it compares whole items); with the seed fixed, which examples are drawn shifts as routes are added",
        answer_contains="DUPLICATE_TOOL_CALL_ID",
    ),
    ByDesign(
        "positive_data_acceptance",
        "POST /v1/admin/webhooks",
        "whether a webhook URL may be reached depends on its host's addresses and the deployment's allow-list "
        "(GATEWAY_WEBHOOK_ALLOWED_HOSTS), which no schema can state",
        answer_contains="WEBHOOK_URL_REFUSED",
    ),
]


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    """A model that answers every conversation with one sentence."""
    scripted = ScriptedModel([openai_turn("Hello from the scripted model.")])
    with ServerThread(scripted) as server:
        scripted.url = server.url
        yield scripted


@pytest.fixture(scope="module")
def gateway_url(fleet_database: str, model: ScriptedModel) -> Iterator[str]:
    with gateways(
        fleet_database, 1, policy_cache_s=0, llm_base_url=f"{model.url}/v1", llm_model="scripted-model",
        llm_retries=0, rate_limit_tenant_rps=0, rate_limit_user_rps=0,  # every case reaches the route, none is a 429
    ) as started:
        yield started[0].url


@pytest.fixture(scope="module")
def gateway_with_policy_cache_url(fleet_database: str, model: ScriptedModel) -> Iterator[str]:
    """As ``gateway_url``, with the policy cache on (as by default): a cached caller's
    tool-call requests take the route's fast lane instead of the framework."""
    with gateways(
        fleet_database, 1, policy_cache_s=60, llm_base_url=f"{model.url}/v1", llm_model="scripted-model",
        llm_retries=0, rate_limit_tenant_rps=0, rate_limit_user_rps=0,
    ) as started:
        yield started[0].url


@pytest.mark.parametrize(
    ("user", "cached"),
    [("carol", False), ("alice", False), ("alice", True)],
    ids=["admin", "member", "member-fast-lane"],
)
def test_schemathesis_finds_no_failure_beyond_the_ones_named_by_design(
    request: pytest.FixtureRequest, user: str, cached: bool
) -> None:
    gateway_url = request.getfixturevalue("gateway_with_policy_cache_url" if cached else "gateway_url")
    report = run_schemathesis(gateway_url, make_token("acme", user, ttl=3600))
    assert report.cases > 100, report.cases  # it did run
    unexpected = report.not_covered_by(BY_DESIGN)
    assert not report.errors, "\n".join(report.errors)
    assert not unexpected, f"{report.cases} cases, {len(unexpected)} failure(s):\n" + "\n".join(
        str(f) for f in unexpected
    )
