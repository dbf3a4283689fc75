"""The configured model providers, and which one a request (and its tenant) gets."""

from __future__ import annotations

import httpx

from gateway.errors import ErrorCode, GatewayError
from gateway.llm.base import ChatModel
from gateway.llm.demo_model import DEMO_MODEL, DemoScriptedModel, check_demo_model, offers_demo_model
from gateway.llm.ollama import OllamaChatModel
from gateway.llm.openai import OpenAIChatModel
from gateway.llm.transport import UpstreamTransport
from gateway.observability.metrics import Metrics
from gateway.settings import DEFAULT_PROVIDER, LlmProvider, Settings


def build_model(provider: LlmProvider, transport: UpstreamTransport, metrics: Metrics) -> ChatModel:
    if provider.kind == "demo":
        return DemoScriptedModel(provider.name, metrics)
    if provider.kind == "ollama":
        return OllamaChatModel(provider, transport, metrics)
    return OpenAIChatModel(provider, transport, metrics)


class ModelProviders:
    """``GATEWAY_LLM_*`` is the provider named ``default``; ``GATEWAY_LLM_PROVIDERS`` adds more.

    The default is ``default`` when set, else the first of the list. In demo mode without
    any, the scripted demo model ``demo-scripted`` is the default; outside demo mode asking
    for it stops start-up.
    """

    def __init__(self, settings: Settings, http: httpx.AsyncClient, metrics: Metrics) -> None:
        check_demo_model(settings)
        transport = UpstreamTransport(
            http,
            retries=settings.llm.retries,
            backoff_s=settings.llm.retry_backoff_s,
            max_response_bytes=settings.llm.max_response_bytes,
        )
        self._models: dict[str, ChatModel] = {
            provider.name: build_model(provider, transport, metrics) for provider in settings.llm.model_providers()
        }
        if offers_demo_model(settings) and DEMO_MODEL not in self._models:
            self._models = {DEMO_MODEL: DemoScriptedModel(DEMO_MODEL, metrics), **self._models}
        self._default = next(iter(self._models), None)

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def get(self, name: str) -> ChatModel | None:
        return self._models.get(name)

    def choose(self, requested: str | None, *, pinned: str | None) -> ChatModel:
        """A request names a provider in ``model``; ``default``, or any name that is no provider's,
        means the default one. A tenant pinned to a provider always gets that one, and naming
        another provider is refused.
        """
        if requested == DEFAULT_PROVIDER:
            requested = None
        if pinned is not None:
            if requested in self._models and requested != pinned:
                raise GatewayError(
                    ErrorCode.FORBIDDEN, f"This tenant's runs use the model provider {pinned!r} only."
                )
            model = self._models.get(pinned)
            if model is None:
                raise GatewayError(
                    ErrorCode.MODEL_NOT_CONFIGURED,
                    "The model provider this tenant is pinned to is not configured on this gateway.",
                )
            return model
        if requested is not None and requested in self._models:
            return self._models[requested]
        if self._default is None:
            raise GatewayError(ErrorCode.MODEL_NOT_CONFIGURED)
        return self._models[self._default]
