"""The gateway's settings: one frozen object, read from the environment once and passed in.

Every field is a ``GATEWAY_*`` environment variable (upper-cased field name with the
prefix); the configuration table in docs/configuration.md is generated from ``FIELD_DOCS``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from gateway.text import DEFAULT_MAX_JSON_DEPTH, MAX_JSON_DEPTH_CEILING

ENV_PREFIX = "GATEWAY_"
DEFAULT_PROVIDER = "default"
JSON_FIELDS = frozenset({"llm_providers"})
SECRET_FIELDS = frozenset({"jwt_secret", "llm_api_key", "service_signing_key", "metrics_token"})
DEFAULT_EMBEDDED_DATA_DIR = ".gateway/postgres"


class SettingsError(Exception):
    """The environment does not describe a valid configuration; the message says which variable."""


LLM_KINDS = ("openai", "ollama")


class LlmProvider(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model provider, one entry of ``GATEWAY_LLM_PROVIDERS`` (a JSON list).

    ``kind`` ``openai``: an OpenAI-compatible ``/chat/completions`` under ``base_url``, which
    includes the version path (``http://host:11434/v1``); ``ollama``: Ollama's native
    ``/api/chat`` under ``base_url`` (``http://host:11434``). The API key is read from the
    environment variable named by ``api_key_env`` when the settings are read.
    """

    name: str
    kind: str = "openai"
    base_url: str
    model: str
    api_key: str | None = None
    api_key_env: str | None = None
    context_window: int = 8192
    timeout_s: float = 60.0

    def __repr__(self) -> str:  # the key never reaches a log line or a traceback
        return f"LlmProvider(name={self.name!r}, kind={self.kind!r}, base_url={self.base_url!r}, model={self.model!r})"


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    database_url: str | None = None
    embedded_data_dir: str = DEFAULT_EMBEDDED_DATA_DIR
    database_pool_size: int = 10
    database_pool_timeout_s: float = 5.0
    database_statement_timeout_s: float = 10.0
    database_idle_in_transaction_timeout_s: float = 30.0

    jwt_secret: str | None = None
    jwt_algorithms: tuple[str, ...] = ("HS256", "RS256", "ES256")
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_leeway_s: int = 30
    jwt_max_lifetime_s: int = 86400
    jwks_url: str | None = None
    jwks_cache_s: int = 300
    jwks_timeout_s: float = 5.0

    demo: bool = False

    run_max_tool_calls: int = 50
    run_max_repeats: int = 2
    run_ttl_s: int = 86_400
    approval_ttl_s: int = 86_400
    allow_self_approval: bool = False

    run_max_steps: int = 8
    run_max_total_tokens: int = 100_000
    run_timeout_s: float = 120.0
    chat_max_messages: int = 1000

    llm_kind: str = "openai"
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key: str | None = None
    llm_context_window: int = 8192
    llm_timeout_s: float = 60.0
    llm_providers: tuple[LlmProvider, ...] = ()
    llm_retries: int = 2
    llm_retry_backoff_s: float = 0.5
    llm_max_response_bytes: int = 8_388_608
    llm_history_share: float = 0.7

    tool_timeout_s: float = 10.0
    tool_max_result_bytes: int = 16_384

    max_body_bytes: int = 1_048_576
    max_batch_size: int = 64
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    policy_cache_s: float = 5.0

    audit_seal_interval_s: float = 1.0
    audit_seal_batch_size: int = 1000
    audit_export_max_per_tenant: int = 2
    audit_export_max_per_process: int = 8
    tools_file: str | None = None
    service_base_urls: tuple[str, ...] = ()
    service_signing_key: str | None = None
    service_signing_key_file: str | None = None
    service_token_issuer: str = "gateway"
    service_token_ttl_s: int = 60
    http_max_connections: int = 100
    http_max_keepalive_connections: int = 50
    http_connect_timeout_s: float = 3.0

    log_level: str = "INFO"
    log_format: str = "json"

    workers: int = 1
    shutdown_timeout_s: float = 30.0
    rate_limit_tenant_rps: float = 500.0
    rate_limit_tenant_burst: int = 1000
    rate_limit_user_rps: float = 50.0
    rate_limit_user_burst: int = 100
    metrics_token: str | None = None
    metrics_tenant_labels: bool = True

    def __post_init__(self) -> None:
        if self.database_url is not None and not self.database_url.startswith("postgresql+asyncpg://"):
            raise SettingsError(
                "GATEWAY_DATABASE_URL must start with postgresql+asyncpg://: the gateway needs PostgreSQL "
                "(unset GATEWAY_DATABASE_URL to use the embedded one, started from ./.gateway/postgres)"
            )
        allowed = {"HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "PS256"}
        unknown = set(self.jwt_algorithms) - allowed
        if unknown or not self.jwt_algorithms:
            raise SettingsError(
                f"GATEWAY_JWT_ALGORITHMS may only name {', '.join(sorted(allowed))}; 'none' is never allowed"
            )
        if self.jwks_url is not None:
            names = ("jwt_audience", "jwt_issuer")
            missing = [f"{ENV_PREFIX}{name.upper()}" for name in names if not getattr(self, name)]
            if missing:
                raise SettingsError(
                    f"GATEWAY_JWKS_URL is set, so {' and '.join(missing)} must be set too (the aud and iss your "
                    "identity provider puts in tokens for this gateway; without them a token it issued to another "
                    "application would be accepted)"
                )
        if self.jwt_max_lifetime_s < 1:
            raise SettingsError("GATEWAY_JWT_MAX_LIFETIME_S must be at least 1")
        if self.log_format not in ("json", "console"):
            raise SettingsError("GATEWAY_LOG_FORMAT must be json or console")
        for name in ("run_max_tool_calls", "run_ttl_s", "approval_ttl_s", "max_body_bytes", "max_batch_size",
                     "audit_seal_batch_size", "service_token_ttl_s", "http_max_connections",
                     "audit_export_max_per_tenant", "audit_export_max_per_process"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be at least 1")
        if self.database_idle_in_transaction_timeout_s <= 0:
            raise SettingsError("GATEWAY_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S must be positive")
        if not 1 <= self.max_json_depth <= MAX_JSON_DEPTH_CEILING:
            raise SettingsError(f"GATEWAY_MAX_JSON_DEPTH must be at least 1 and at most {MAX_JSON_DEPTH_CEILING}")
        if self.audit_seal_interval_s < 0:
            raise SettingsError("GATEWAY_AUDIT_SEAL_INTERVAL_S must be at least 0")
        if self.run_max_repeats < 0:
            raise SettingsError("GATEWAY_RUN_MAX_REPEATS must be at least 0")
        if self.workers < 1:
            raise SettingsError("GATEWAY_WORKERS must be at least 1")
        if self.shutdown_timeout_s <= 0:
            raise SettingsError("GATEWAY_SHUTDOWN_TIMEOUT_S must be positive")
        for name in ("rate_limit_tenant_rps", "rate_limit_tenant_burst", "rate_limit_user_rps", "rate_limit_user_burst"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be at least 0 (0: no limit)")
        if self.http_max_keepalive_connections < 0 or self.http_connect_timeout_s <= 0:
            raise SettingsError(
                "GATEWAY_HTTP_MAX_KEEPALIVE_CONNECTIONS must be at least 0 and GATEWAY_HTTP_CONNECT_TIMEOUT_S positive"
            )

        if self.metrics_token is not None and len(self.metrics_token.encode()) < 16:
            raise SettingsError("GATEWAY_METRICS_TOKEN must be at least 16 bytes")

        self._check_agent_loop()


    @property
    def rate_limits_enabled(self) -> bool:
        return self.rate_limit_tenant_rps > 0 or self.rate_limit_user_rps > 0

    def _check_agent_loop(self) -> None:
        for name in ("run_max_steps", "run_max_total_tokens", "chat_max_messages", "llm_context_window",
                     "llm_max_response_bytes"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be at least 1")
        for name in ("run_timeout_s", "llm_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be more than 0")
        if self.llm_retries < 0 or self.llm_retry_backoff_s < 0:
            raise SettingsError("GATEWAY_LLM_RETRIES and GATEWAY_LLM_RETRY_BACKOFF_S must be at least 0")
        if not 0 < self.llm_history_share <= 1:
            raise SettingsError("GATEWAY_LLM_HISTORY_SHARE must be more than 0 and at most 1")
        if self.llm_kind not in LLM_KINDS:
            raise SettingsError("GATEWAY_LLM_KIND must be openai or ollama")
        if self.llm_base_url is not None and not self.llm_model:
            raise SettingsError("GATEWAY_LLM_MODEL must be set with GATEWAY_LLM_BASE_URL")
        names = {DEFAULT_PROVIDER} if self.llm_base_url is not None else set()
        for provider in self.llm_providers:
            where = f"GATEWAY_LLM_PROVIDERS entry {provider.name!r}"
            if provider.name in names:
                raise SettingsError(f"{where}: the name is used twice (`default` is the GATEWAY_LLM_* provider)")
            names.add(provider.name)
            if provider.kind not in LLM_KINDS:
                raise SettingsError(f"{where}: kind must be openai or ollama")
            if not provider.base_url.startswith(("http://", "https://")):
                raise SettingsError(f"{where}: base_url must be an http(s) URL")
            if provider.context_window < 1 or provider.timeout_s <= 0:
                raise SettingsError(f"{where}: context_window and timeout_s must be positive")
        if self.llm_base_url is not None and not self.llm_base_url.startswith(("http://", "https://")):
            raise SettingsError("GATEWAY_LLM_BASE_URL must be an http(s) URL")

    def model_providers(self) -> tuple[LlmProvider, ...]:
        """The configured providers; the ``GATEWAY_LLM_*`` one, named ``default``, comes first."""
        providers = list(self.llm_providers)
        if self.llm_base_url is not None and self.llm_model:
            providers.insert(
                0,
                LlmProvider(
                    name=DEFAULT_PROVIDER,
                    kind=self.llm_kind,
                    base_url=self.llm_base_url,
                    model=self.llm_model,
                    api_key=self.llm_api_key,
                    context_window=self.llm_context_window,
                    timeout_s=self.llm_timeout_s,
                ),
            )
        return tuple(providers)

    def __repr__(self) -> str:  # secrets never reach a log line or a traceback
        shown = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            shown.append(f"{name}={'[REDACTED]' if name in SECRET_FIELDS and value is not None else repr(value)}")
        return f"Settings({', '.join(shown)})"

    def require_signing_setup(self) -> None:
        """Stop start-up when no key would verify a token (outside demo mode)."""
        if self.jwt_secret is None and self.jwks_url is None:
            raise SettingsError(
                "GATEWAY_JWT_SECRET (HS256) or GATEWAY_JWKS_URL (RS256/ES256) must be set; "
                "run `gateway serve --demo` for a local demo with a generated secret"
            )
        if self.jwt_secret is not None and len(self.jwt_secret.encode()) < 32:
            raise SettingsError("GATEWAY_JWT_SECRET must be at least 32 bytes")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        raw: dict[str, Any] = {}
        for name in cls.__struct_fields__:
            key = ENV_PREFIX + name.upper()
            if key in env and env[key] != "":
                raw[name] = _parse_env_value(cls, name, env[key])
        if "llm_providers" in raw:
            raw["llm_providers"] = _providers_with_keys(raw["llm_providers"], env)
        raw.update(overrides)
        try:
            return msgspec.convert(raw, cls, strict=False)
        except msgspec.ValidationError as exc:
            field = str(exc).rsplit("$.", 1)[-1].rstrip("`")
            raise SettingsError(f"{ENV_PREFIX}{field.upper()} is invalid: {str(exc).split(' - ')[0]}") from None


def _providers_with_keys(value: Any, env: Mapping[str, str]) -> Any:
    """Each provider's API key comes from the environment variable its ``api_key_env`` names."""
    if not isinstance(value, list):
        raise SettingsError("GATEWAY_LLM_PROVIDERS must be a JSON list of providers")
    for entry in value:
        if isinstance(entry, dict) and entry.get("api_key_env") and not entry.get("api_key"):
            entry["api_key"] = env.get(str(entry["api_key_env"])) or None
    return value


def _parse_env_value(cls: type[Settings], name: str, value: str) -> Any:
    if name in JSON_FIELDS:
        try:
            return msgspec.json.decode(value)
        except msgspec.DecodeError:
            raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be JSON") from None
    annotation = cls.__annotations__[name]
    if "tuple" in str(annotation):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if annotation in ("bool", bool):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be true or false")
    return value


FIELD_DOCS: dict[str, str] = {
    "database_url": "PostgreSQL server: `postgresql+asyncpg://user@host/db`. Unset: the embedded PostgreSQL.",
    "embedded_data_dir": "Without `GATEWAY_DATABASE_URL`: the data folder of the embedded PostgreSQL, which "
                         "`gateway` commands start (Unix socket only) and stop.",
    "database_pool_size": "Connections per process in the database pool.",
    "database_pool_timeout_s": "Seconds to wait for a pooled connection before answering 503.",
    "database_statement_timeout_s": "Seconds a single database statement may run.",
    "database_idle_in_transaction_timeout_s": "Seconds a gateway session may sit idle inside a transaction before "
    "PostgreSQL ends it (`idle_in_transaction_session_timeout`), so no stalled caller holds a connection and its locks.",
    "jwt_secret": "HS256 signing secret (at least 32 bytes). Required unless `GATEWAY_JWKS_URL` is set or in demo mode.",
    "jwt_algorithms": "Comma-separated allow-list of JWT algorithms; HS* use the secret, RS*/ES*/PS* the JWKS.",
    "jwt_issuer": "When set, tokens must carry this `iss`. Required with `GATEWAY_JWKS_URL`.",
    "jwt_audience": "When set, tokens must carry this `aud`. Required with `GATEWAY_JWKS_URL`.",
    "jwt_leeway_s": "Clock skew tolerated on `exp`, `nbf` and `iat`, in seconds.",
    "jwt_max_lifetime_s": "Longest lifetime a token may claim, in seconds: `exp - iat` (`exp - now` without `iat`).",
    "jwks_url": "URL of the identity provider's JWKS (RS256/ES256 keys).",
    "jwks_cache_s": "Seconds the JWKS is cached; an unknown `kid` refreshes it sooner (at most every 10 s).",
    "jwks_timeout_s": "Timeout of a JWKS fetch, in seconds.",
    "demo": "Demo mode: generate and keep a local secret, seed the demo tenants and print tokens.",
    "run_max_tool_calls": "Default `max_tool_calls` of a new run (clamped by the tenant's cap).",
    "run_max_repeats": "Default `max_repeats` of a new run.",
    "run_ttl_s": "Default lifetime of a run, in seconds (its `expires_at`).",
    "approval_ttl_s": "Seconds a pending approval waits for a decision before it expires.",
    "allow_self_approval": "Let an approver approve their own request.",
    "run_max_steps": "Agent loop: default (and highest) `max_steps`, the model round trips of one run.",
    "run_max_total_tokens": "Agent loop: default (and highest) `max_total_tokens`, input + output over one run.",
    "run_timeout_s": "Agent loop: default (and highest) wall-clock limit of one run (or resume), in seconds.",
    "chat_max_messages": "Agent loop: most messages one chat request may carry (400 `INVALID_REQUEST` above).",
    "llm_kind": "Kind of the default model provider: `openai` (any OpenAI-compatible API) or `ollama` (native).",
    "llm_base_url": "Base URL of the default provider; for `openai` with the version path (`http://host:11434/v1`).",
    "llm_model": "Model name the default provider is asked for (required with `GATEWAY_LLM_BASE_URL`).",
    "llm_api_key": "API key of the default provider, sent as a bearer token; never logged or returned.",
    "llm_context_window": "Context window of the default provider's model, in tokens (history is trimmed to a share).",
    "llm_timeout_s": "Timeout of one request to the default provider, in seconds (capped by the run's deadline).",
    "llm_providers": "More providers, as a JSON list of `{name, kind, base_url, model, api_key_env, context_window, "
                     "timeout_s}`; a request picks one by `model`, a tenant may be pinned to one.",
    "llm_retries": "Retries of a model request after a refused connection, a timeout, a 5xx or a 429.",
    "llm_retry_backoff_s": "First retry delay in seconds, doubled on each retry (a 429's Retry-After wins).",
    "llm_max_response_bytes": "Largest model response read; a larger one is `UPSTREAM_BAD_RESPONSE`.",
    "llm_history_share": "Share of the context window the prompt may fill before the oldest exchanges are dropped.",
    "tool_timeout_s": "Default per-call timeout of a tool that declares none.",
    "tool_max_result_bytes": "Default result size limit of a tool that declares none.",
    "max_body_bytes": "Largest request body accepted (413 `PAYLOAD_TOO_LARGE` above).",
    "max_batch_size": "Most tool calls accepted in one batch.",
    "max_json_depth": "Deepest nesting of arrays and objects accepted in a JSON body, and in one call's arguments "
    "(at most 512); deeper is `400 INVALID_REQUEST` (`422 INVALID_TOOL_CALL` for a tool-call batch, "
    "`INVALID_ARGUMENTS` for one call's arguments).",
    "policy_cache_s": "Seconds tenants, role→permission maps and tool policies are cached in a process: a change "
    "made on another gateway process is honoured within this time (at once on the process that made it).",
    "audit_seal_interval_s": "Seconds between the audit sealer's rounds in each process (it links new audit rows "
    "into their tenant's hash chain, off the request path); `0` turns the process's sealer off.",
    "audit_seal_batch_size": "Most audit rows one sealer round links in one transaction.",
    "audit_export_max_per_tenant": "Audit exports one tenant may stream at once from one process; one more is "
    "`429 RATE_LIMITED` with `Retry-After`.",
    "audit_export_max_per_process": "Audit exports one process streams at once, all tenants together; one more is "
    "`429 RATE_LIMITED` with `Retry-After`.",
    "tools_file": "A TOML or YAML file declaring HTTP tools (see [HTTP tools](http-tools.md)); checked at start.",
    "service_base_urls": "Comma-separated `NAME=URL` base URLs of the business services; they override the "
    "tools file's `base_url` and, with it, are the only hosts HTTP tools can reach.",
    "service_signing_key": "PEM private key (EC P-256 → ES256, or RSA → RS256) the gateway signs service tokens "
    "with; `\\n` may stand for line breaks. Required when HTTP tools are declared (demo mode generates one). "
    "It also signs and checks audit anchors (`gateway audit anchor`, `audit verify --anchor`).",
    "service_signing_key_file": "Path of a PEM file holding that key (instead of `GATEWAY_SERVICE_SIGNING_KEY`).",
    "service_token_issuer": "The `iss` claim of service tokens.",
    "service_token_ttl_s": "Lifetime of a service token, in seconds.",
    "http_max_connections": "Most connections the process's HTTP client opens to business services, in total.",
    "http_max_keepalive_connections": "Idle connections the HTTP client keeps open for reuse.",
    "http_connect_timeout_s": "Timeout to open a connection to a business service, in seconds (the call as a "
    "whole is bounded by the tool's timeout).",
    "log_level": "Log level: DEBUG, INFO, WARNING, ERROR.",
    "log_format": "`json` (one event per line) or `console` (for a terminal).",
    "workers": "Worker processes of `gateway serve` (`--workers` overrides); all state is in the database.",
    "shutdown_timeout_s": "On SIGTERM, seconds in-flight requests get to finish before they are cancelled.",
    "rate_limit_tenant_rps": "Requests per second a tenant may make, across all processes (0: no limit).",
    "rate_limit_tenant_burst": "Requests a tenant may make at once above its rate (0: one second's worth).",
    "rate_limit_user_rps": "Requests per second one user of a tenant may make, across all processes (0: no limit).",
    "rate_limit_user_burst": "Requests a user may make at once above their rate (0: one second's worth).",
    "metrics_token": "When set, `GET /metrics` answers only a request bearing it (`Authorization: Bearer ...`; "
    "Prometheus' `authorization` setting); otherwise anyone who reaches the route may scrape.",
    "metrics_tenant_labels": "`false`: metrics carry no tenant label (`gateway_approvals_pending` is one sum), "
    "so a scrape does not list the tenants.",
}


def markdown_table() -> str:
    """The settings table of docs/configuration.md, generated from the fields and ``FIELD_DOCS``."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in zip(Settings.__struct_fields__, msgspec.structs.fields(Settings), strict=True):
        default = field.default
        if isinstance(default, tuple):
            default = ",".join(default) or None
        shown = "(none)" if default is None else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        lines.append(f"| `{ENV_PREFIX}{name.upper()}` | {shown} | {FIELD_DOCS[name]} |")
    return "\n".join(lines)
