"""The interface the agent loop talks to: ``chat(messages, tools) -> (message, usage)``.

Messages travel in the OpenAI chat format (plain dicts: ``role``, ``content``,
``tool_calls``, ``tool_call_id``); each adapter converts to and from its provider's wire
format, so the loop never learns which provider answers it.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol, TypeVar

import msgspec
import structlog

from gateway.errors import ErrorCode, GatewayError
from gateway.text import MAX_JSON_DEPTH_CEILING, nests_deeper_than

if TYPE_CHECKING:
    from gateway.llm.transport import UpstreamTransport
    from gateway.observability.metrics import Metrics
    from gateway.settings import LlmProvider

log = structlog.get_logger("gateway.llm")

Message = dict[str, Any]
Answer = TypeVar("Answer")

MAX_TOKEN_COUNT = 2**31 - 1
TokenCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_COUNT)]
"""A token count as a provider reports it in an answer's usage. One that is negative or
absurdly large is a malformed answer (``UPSTREAM_BAD_RESPONSE``): counted, it would move a
run's budget backwards, fail the metrics' counters, or overflow the run's stored usage."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


@dataclass(frozen=True, slots=True)
class ModelToolCall:
    """A tool call as the model produced it, unchecked: the agent loop applies the protocol's rules."""

    id: str | None
    name: str | None
    arguments: str
    """A JSON string, exactly as the model produced it (Ollama's objects are encoded)."""
    type: str = "function"
    """What the answer said; an answer that leaves it out means ``function``."""


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    content: str | None
    tool_calls: list[ModelToolCall] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChatResult:
    message: AssistantMessage
    usage: Usage
    finish_reason: str | None
    model: str


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """What a request may tune in each model call; ``None`` leaves the provider's default."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tool_choice: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingOptions:
        known = set(cls.__slots__)  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


class ChatModel(Protocol):
    name: str
    """The provider's configured name (``default`` for the ``GATEWAY_LLM_*`` one)."""
    model: str
    context_window: int

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        options: SamplingOptions,
        deadline: float | None = None,
    ) -> ChatResult:
        """One model round trip; ``deadline`` (event-loop time) is the run's, for retry decisions."""
        ...


class UpstreamError(GatewayError):
    """The model provider failed in a way the caller must hear about (502/504)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(code, message)


METRIC_OUTCOMES = {
    ErrorCode.UPSTREAM_TIMEOUT: "timeout",
    ErrorCode.UPSTREAM_UNAVAILABLE: "unavailable",
    ErrorCode.UPSTREAM_REJECTED: "rejected",
    ErrorCode.UPSTREAM_BAD_RESPONSE: "bad_response",
}
"""The ``outcome`` label of ``gateway_model_request_duration_seconds`` for each way a round trip fails."""


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class HttpChatModel(ABC):
    """A provider answering one JSON POST to ``base_url`` + ``path`` per round trip.

    An adapter says what to send (``payload``) and how to read the answer (``parse``); the
    round trip itself, with its retries and the run's deadline, is the transport's.
    """

    path: ClassVar[str]

    def __init__(self, provider: LlmProvider, transport: UpstreamTransport, metrics: Metrics) -> None:
        self.name = provider.name
        self.model = provider.model
        self.context_window = provider.context_window
        self._provider = provider
        self._transport = transport
        self._metrics = metrics
        self._url = provider.base_url.rstrip("/") + self.path

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        options: SamplingOptions,
        deadline: float | None = None,
    ) -> ChatResult:
        """One round trip, its retries included; its latency and tokens go to the model metrics."""
        started = time.perf_counter()
        outcome = "cancelled"  # what is left when neither an answer nor an error came back (the run's deadline)
        try:
            body = await self._transport.post_json(
                self._url,
                self.payload(messages, tools, options),
                provider=self.name,
                api_key=self._provider.api_key,
                timeout_s=self._provider.timeout_s,
                deadline=deadline,
            )
            result = self.parse(body)
        except UpstreamError as exc:
            outcome = METRIC_OUTCOMES.get(exc.code, "error")
            raise
        except Exception:
            outcome = "error"
            raise
        else:
            outcome = "ok"
            return result
        finally:
            usage = result.usage if outcome == "ok" else None
            self._metrics.model_call(
                model=self.model,
                duration_s=time.perf_counter() - started,
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
                outcome=outcome,
            )

    @abstractmethod
    def payload(
        self, messages: list[Message], tools: list[dict[str, Any]], options: SamplingOptions
    ) -> dict[str, Any]: ...

    @abstractmethod
    def parse(self, body: bytes) -> ChatResult: ...


def decode_answer(decoder: msgspec.json.Decoder[Answer], body: bytes, *, provider: str) -> Answer:
    """The provider's answer in its wire type; one that does not fit is ``UPSTREAM_BAD_RESPONSE``,
    as is one nested deeper than any argument could be (the decoder would recurse until it
    raised ``RecursionError``)."""
    if nests_deeper_than(body, MAX_JSON_DEPTH_CEILING):
        log.warning("model_response_malformed", provider=provider, problem="nested too deep")
        raise UpstreamError(ErrorCode.UPSTREAM_BAD_RESPONSE)
    try:
        return decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # msgspec's message names the path and the expected type; it quotes no content.
        problem = str(exc).splitlines()[0][:200] if isinstance(exc, msgspec.ValidationError) else "not JSON"
        log.warning("model_response_malformed", provider=provider, problem=problem)
        raise UpstreamError(ErrorCode.UPSTREAM_BAD_RESPONSE) from None


def model_tool_call(
    *, id: str | None, name: str | None, arguments: dict[str, Any] | str | None, type: str | None = None
) -> ModelToolCall:
    """A tool call as the model sent it; its arguments as a JSON string (``{}`` when it sent none).

    Nothing is refused here: a call without a name, with an odd id or type is answered by the
    agent loop with the protocol's code, like any other call that breaks a rule.
    """
    if not isinstance(arguments, str):
        arguments = msgspec.json.encode(arguments or {}).decode()
    return ModelToolCall(id=id, name=name, arguments=arguments, type="function" if type is None else type)
