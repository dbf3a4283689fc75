"""Hostile bodies on the two routes that take what a model wrote: arbitrary bytes, arbitrary
JSON, arbitrary Unicode (NUL, lone surrogates, non-characters) and arbitrary depth. The
gateway never answers 5xx, an error always parses as the envelope, and ``/healthz``
answers afterwards. Against a real `gateway serve` process; bounded and derandomized."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from tests.support.loopback import ServerThread
from tests.support.processes import gateways
from tests.support.scripted_model import ScriptedModel, openai_turn
from tests.support.tokens import make_token

pytestmark = pytest.mark.postgres

FUZZ = settings(
    max_examples=120,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

HOSTILE = st.sampled_from(["\x00", "\ud800", "\udfff", "\ufffe", "\uffff", "\U0010ffff", "\u202e", "\x1f", "a"])
TEXT = st.text(
    alphabet=st.one_of(HOSTILE, st.characters(exclude_categories=())),  # surrogates (Cs) included
    max_size=40,
)
SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), TEXT,
)
JSON_VALUE = st.recursive(
    SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=25
)


def encode(value: Any) -> bytes:
    """JSON as a careless client writes it: lone surrogates as \\u escapes, NaN and Infinity as bare words."""
    return json.dumps(value, ensure_ascii=True).encode()


@st.composite
def deep(draw: st.DrawFn, inside: tuple[str, str] = ("", "")) -> bytes:
    """Nesting ``depth`` deep, alone or as one value of an otherwise well-formed body (``inside``)."""
    depth = draw(st.integers(min_value=1, max_value=100_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    tail = draw(st.sampled_from(["0", '"x"', "null", ""]))
    close = draw(st.booleans())
    before, after = draw(st.sampled_from([("", ""), inside]))
    return (before + opener * depth + tail + (closer * depth if close else "") + after).encode()


IN_A_CALL = ('{"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": ', "}}]}")
IN_A_CHAT = ('{"model": "default", "messages": [{"role": "user", "content": "hi"}], "metadata": ', "}")


def tool_call_bodies() -> st.SearchStrategy[bytes]:
    call = st.fixed_dictionaries(
        {
            "id": st.one_of(TEXT, JSON_VALUE),
            "type": st.one_of(st.just("function"), JSON_VALUE),
            "function": st.one_of(
                st.fixed_dictionaries(
                    {"name": st.one_of(st.sampled_from(["add", "get_time", "create_article"]), TEXT),
                     "arguments": st.one_of(TEXT, JSON_VALUE, JSON_VALUE.map(encode).map(bytes.decode))}
                ),
                JSON_VALUE,
            ),
        }
    )
    return st.one_of(
        st.binary(max_size=600),
        JSON_VALUE.map(encode),
        st.lists(call, min_size=0, max_size=5).map(lambda calls: encode({"tool_calls": calls})),
        deep(IN_A_CALL),
    )


def chat_bodies() -> st.SearchStrategy[bytes]:
    message = st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool", "developer"]), TEXT),
         "content": st.one_of(TEXT, JSON_VALUE)},
        optional={"tool_call_id": TEXT, "name": TEXT},
    )
    request = st.fixed_dictionaries(
        {"model": st.one_of(st.just("default"), TEXT), "messages": st.lists(message, min_size=0, max_size=3)},
        optional={"gateway": JSON_VALUE, "temperature": JSON_VALUE, "metadata": JSON_VALUE, "stop": JSON_VALUE},
    )
    return st.one_of(st.binary(max_size=600), JSON_VALUE.map(encode), request.map(encode), deep(IN_A_CHAT))


@pytest.fixture(scope="module", params=[0, 60], ids=["framework", "fast-lane"])
def gateway_url(fleet_database: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """With the policy cache off every tool-call request goes through the framework; with it
    on, the fuzzer's caller is cached and its tool-call requests take the route's fast lane."""
    scripted = ScriptedModel([openai_turn("Fine.")])
    with ServerThread(scripted) as model:
        with gateways(
            fleet_database, 1, policy_cache_s=request.param, llm_base_url=f"{model.url}/v1",
            llm_model="scripted-model",
            llm_retries=0, rate_limit_tenant_rps=0, rate_limit_user_rps=0,  # every body reaches the route
        ) as started:
            yield started[0].url


@pytest.fixture(scope="module")
def http(gateway_url: str) -> Iterator[httpx.Client]:
    token = make_token("acme", "bob", ttl=3600)
    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def run_id(http: httpx.Client) -> str:
    response = http.post("/v1/runs", json={"max_tool_calls": 10_000_000})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def assert_answered_properly(body: bytes, response: httpx.Response) -> None:
    note(f"{len(body)} bytes, starting {body[:160]!r}, ending {body[-40:]!r}")
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and error["code"].isupper()
        assert isinstance(error["message"], str) and error["message"]
        assert error["request_id"] == response.headers["x-request-id"]
    else:
        response.json()


def test_tool_calls_never_answer_5xx_to_hostile_bodies(http: httpx.Client, run_id: str) -> None:
    @FUZZ
    @given(body=tool_call_bodies())
    def post(body: bytes) -> None:
        response = http.post(f"/v1/runs/{run_id}/tool-calls", content=body, headers={"Content-Type": "application/json"})
        assert_answered_properly(body, response)

    post()
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 200


def test_chat_completions_never_answer_5xx_to_hostile_bodies(http: httpx.Client) -> None:
    @FUZZ
    @given(body=chat_bodies())
    def post(body: bytes) -> None:
        response = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
        assert_answered_properly(body, response)

    post()
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 200
