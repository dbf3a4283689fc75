"""The agent loop's settings: a default provider from the environment alone, more from JSON."""

from __future__ import annotations

import pytest

from gateway.settings import Settings, SettingsError


def test_the_default_provider_comes_from_the_environment_alone() -> None:
    settings = Settings.from_env({
        "GATEWAY_LLM_KIND": "ollama", "GATEWAY_LLM_BASE_URL": "http://gpu:11434", "GATEWAY_LLM_MODEL": "llama3.1:8b",
        "GATEWAY_LLM_API_KEY": "k-123", "GATEWAY_LLM_CONTEXT_WINDOW": "4096", "GATEWAY_LLM_TIMEOUT_S": "30",
    })
    (provider,) = settings.llm.model_providers()
    assert (provider.name, provider.kind, provider.base_url, provider.model) == (
        "default", "ollama", "http://gpu:11434", "llama3.1:8b")
    assert (provider.api_key, provider.context_window, provider.timeout_s) == ("k-123", 4096, 30.0)
    assert (settings.agent.max_steps, settings.agent.max_total_tokens, settings.agent.timeout_s) == (8, 100_000, 120.0)
    assert settings.llm.timeout_s == 30.0


def test_more_providers_come_from_json_with_their_keys_from_named_variables() -> None:
    settings = Settings.from_env({
        "GATEWAY_LLM_PROVIDERS": '[{"name": "vllm", "base_url": "http://vllm:8000/v1", "model": "qwen",'
                                 ' "api_key_env": "VLLM_KEY", "context_window": 32768}]',
        "VLLM_KEY": "secret-vllm-key",
    })
    (provider,) = settings.llm.model_providers()
    assert provider.name == "vllm" and provider.kind == "openai" and provider.api_key == "secret-vllm-key"
    assert "secret-vllm-key" not in repr(settings)


@pytest.mark.parametrize(
    "env, named",
    [
        ({"GATEWAY_LLM_KIND": "anthropic"}, "GATEWAY_LLM_KIND"),
        ({"GATEWAY_LLM_BASE_URL": "http://x/v1"}, "GATEWAY_LLM_MODEL"),
        ({"GATEWAY_LLM_PROVIDERS": "not json"}, "GATEWAY_LLM_PROVIDERS"),
        ({"GATEWAY_LLM_PROVIDERS": '[{"name": "a", "kind": "x", "base_url": "http://a", "model": "m"}]'}, "'a'"),
        ({"GATEWAY_LLM_HISTORY_SHARE": "1.5"}, "GATEWAY_LLM_HISTORY_SHARE"),
        ({"GATEWAY_RUN_MAX_STEPS": "0"}, "GATEWAY_RUN_MAX_STEPS"),
        ({"GATEWAY_CHAT_MAX_MESSAGES": "0"}, "GATEWAY_CHAT_MAX_MESSAGES"),
    ],
)
def test_a_bad_agent_setting_stops_start_up_naming_it(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)


def test_secrets_never_show_in_the_settings_repr() -> None:
    settings = Settings.from_flat(jwt_secret="s" * 40, llm_api_key="sk-live-key")
    assert "sk-live-key" not in repr(settings) and "s" * 40 not in repr(settings)
