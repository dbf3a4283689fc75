"""The gateway's settings: one frozen object, read from the environment once and passed in.

The settings come in small groups (``settings.database.url``, ``settings.tools.timeout_s``).
Every field is one ``GATEWAY_*`` environment variable: the group's prefix and the field's
name, upper-cased (``database.pool_size`` is ``GATEWAY_DATABASE_POOL_SIZE``), unless the
group names it otherwise in ``env_names``. A value is checked by its type declaration
(bounds, choices, patterns); the rules that tie several fields together are in
``Settings._check_rules_across_fields`` and ``Settings.require_signing_setup``. An invalid value stops
start-up with a one-line message naming its variable. The configuration table in
docs/configuration.md is generated from ``FIELD_DOCS``, keyed by the variables' names without the prefix.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta
from msgspec import inspect as mi

from gateway.text import DEFAULT_MAX_JSON_DEPTH, MAX_JSON_DEPTH_CEILING

ENV_PREFIX = "GATEWAY_"
DEFAULT_PROVIDER = "default"
SECRET_FIELDS = frozenset({"jwt_secret", "llm_api_key", "service_signing_key", "metrics_token", "oidc_client_secret"})
DEFAULT_EMBEDDED_DATA_DIR = ".gateway/postgres"

HTTP_URL = "^https?://"
POSTGRESQL_URL = r"^postgresql\+asyncpg://"
JWT_ALGORITHMS = ("ES256", "ES384", "HS256", "HS384", "HS512", "PS256", "RS256", "RS384", "RS512")

AtLeast0 = Annotated[int, Meta(ge=0)]
AtLeast1 = Annotated[int, Meta(ge=1)]
NotNegative = Annotated[float, Meta(ge=0)]
Positive = Annotated[float, Meta(gt=0)]
HttpUrl = Annotated[str, Meta(pattern=HTTP_URL)]
DatabaseTimeout = Annotated[float, Meta(ge=0.001, le=86_400)]
"""A PostgreSQL session timeout, sent in whole milliseconds: under one it would be 0, which
PostgreSQL reads as no limit at all."""
LlmKind = Literal["openai", "ollama", "demo"]


class SettingsError(Exception):
    """The environment does not describe a valid configuration; the message says which variable."""


class LlmProvider(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model provider, one entry of ``GATEWAY_LLM_PROVIDERS`` (a JSON list).

    ``kind`` ``openai``: an OpenAI-compatible ``/chat/completions`` under ``base_url``, which
    includes the version path (``http://host:11434/v1``); ``ollama``: Ollama's native
    ``/api/chat`` under ``base_url`` (``http://host:11434``). The API key is read from the
    environment variable named by ``api_key_env`` when the settings are read.
    """

    name: str
    kind: LlmKind = "openai"
    base_url: HttpUrl
    model: str
    api_key: str | None = None
    api_key_env: str | None = None
    context_window: AtLeast1 = 8192
    timeout_s: Positive = 60.0

    def __repr__(self) -> str:  # the key never reaches a log line or a traceback
        return f"LlmProvider(name={self.name!r}, kind={self.kind!r}, base_url={self.base_url!r}, model={self.model!r})"


class Group(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One group of settings; its fields' variables are ``GATEWAY_`` + ``env_prefix`` + the field's name."""

    env_prefix: ClassVar[str] = ""
    env_names: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def env_name(cls, field: str) -> str:
        """The field's variable, without ``GATEWAY_`` and lower-cased: its key in ``FIELD_DOCS``."""
        return cls.env_names.get(field, cls.env_prefix + field)

    def __repr__(self) -> str:  # secrets never reach a log line or a traceback
        shown = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            hidden = self.env_name(name) in SECRET_FIELDS and value is not None
            shown.append(f"{name}={'[REDACTED]' if hidden else repr(value)}")
        return f"{type(self).__name__}({', '.join(shown)})"


class DatabaseSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    env_prefix = "database_"
    env_names = {"embedded_data_dir": "embedded_data_dir"}

    url: Annotated[str, Meta(pattern=POSTGRESQL_URL)] | None = None
    embedded_data_dir: str = DEFAULT_EMBEDDED_DATA_DIR
    pool_size: AtLeast1 = 10
    pool_timeout_s: Positive = 5.0
    statement_timeout_s: DatabaseTimeout = 10.0
    idle_in_transaction_timeout_s: DatabaseTimeout = 30.0
    pgbouncer: bool = False
    group_commit_lanes: Annotated[int, Meta(ge=1, le=16)] = 2
    group_commit_max_requests: Annotated[int, Meta(ge=1, le=1000)] = 64
    group_commit_overflow_after_s: Annotated[float, Meta(ge=0, le=1)] = 0.005


class JwtSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a caller's token is verified: the HS* secret and the claims every token must meet."""

    env_prefix = "jwt_"

    secret: str | None = None
    algorithms: Annotated[tuple[Literal[JWT_ALGORITHMS], ...], Meta(min_length=1)] = ("HS256", "RS256", "ES256")
    issuer: str | None = None
    audience: str | None = None
    leeway_s: Annotated[int, Meta(ge=0, le=3600)] = 30
    max_lifetime_s: AtLeast1 = 86400


class JwksSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The identity provider's keys (RS*/ES*/PS* tokens)."""

    env_prefix = "jwks_"

    url: str | None = None
    cache_s: AtLeast0 = 300
    timeout_s: Positive = 5.0


class RunSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Defaults of a new run of tool calls."""

    env_prefix = "run_"

    max_tool_calls: AtLeast1 = 50
    max_repeats: AtLeast0 = 2
    ttl_s: AtLeast1 = 86_400


class ApprovalSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    env_prefix = "approval_"
    env_names = {"allow_self_approval": "allow_self_approval"}

    ttl_s: AtLeast1 = 86_400
    allow_self_approval: bool = False


class AgentSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The agent loop's defaults, which are also the highest values a request may ask for."""

    env_prefix = "run_"
    env_names = {"chat_max_messages": "chat_max_messages"}

    max_steps: AtLeast1 = 8
    max_total_tokens: AtLeast1 = 100_000
    timeout_s: Positive = 120.0
    chat_max_messages: AtLeast1 = 1000


class LlmSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The model providers: the ``default`` one from its own variables, more as JSON, and how they are called."""

    env_prefix = "llm_"

    kind: LlmKind = "openai"
    base_url: HttpUrl | None = None
    model: str | None = None
    api_key: str | None = None
    context_window: AtLeast1 = 8192
    timeout_s: Positive = 60.0
    providers: tuple[LlmProvider, ...] = ()
    retries: AtLeast0 = 2
    retry_backoff_s: NotNegative = 0.5
    max_response_bytes: AtLeast1 = 8_388_608
    max_requests_per_tenant: AtLeast1 = 25
    history_share: Annotated[float, Meta(gt=0, le=1)] = 0.7

    def model_providers(self) -> tuple[LlmProvider, ...]:
        """The configured providers; the ``GATEWAY_LLM_*`` one, named ``default``, comes first."""
        if self.base_url is None or not self.model:
            return self.providers
        default = LlmProvider(
            name=DEFAULT_PROVIDER,
            kind=self.kind,
            base_url=self.base_url,
            model=self.model,
            api_key=self.api_key,
            context_window=self.context_window,
            timeout_s=self.timeout_s,
        )
        return (default, *self.providers)


class ToolSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Limits of a tool that declares none, and the file that declares HTTP tools."""

    env_prefix = "tool_"
    env_names = {"file": "tools_file"}

    timeout_s: Positive = 10.0
    max_result_bytes: AtLeast1 = 16_384
    max_remote_calls_per_tenant: AtLeast1 = 25
    file: str | None = None


class McpUpstreamSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The MCP servers of the tools file (``[mcp_servers.NAME]``): how often their tools are listed."""

    env_prefix = "mcp_"

    refresh_s: Positive = 300.0
    list_timeout_s: Positive = 10.0


class RequestLimits(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one request may carry."""

    max_body_bytes: AtLeast1 = 1_048_576
    max_head_bytes: Annotated[int, Meta(ge=1024, le=16_777_216)] = 65_536
    max_batch_size: AtLeast1 = 64
    max_json_depth: Annotated[int, Meta(ge=1, le=MAX_JSON_DEPTH_CEILING)] = DEFAULT_MAX_JSON_DEPTH


class AuditSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    env_prefix = "audit_"

    seal_interval_s: NotNegative = 1.0
    seal_batch_size: AtLeast1 = 1000
    export_max_per_tenant: AtLeast1 = 2
    export_max_per_process: AtLeast1 = 8
    verify_max_per_tenant: AtLeast1 = 1
    verify_max_per_process: AtLeast1 = 2


class ServiceSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The business services HTTP tools reach, and the key that signs the gateway's tokens to them."""

    env_prefix = "service_"

    base_urls: tuple[str, ...] = ()
    signing_key: str | None = None
    signing_key_file: str | None = None
    token_issuer: str = "gateway"
    token_ttl_s: AtLeast1 = 60


class HttpClientSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The process's one pooled HTTP client to business services."""

    env_prefix = "http_"

    max_connections: AtLeast1 = 100
    max_keepalive_connections: AtLeast0 = 50
    connect_timeout_s: Positive = 3.0


class LogSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    env_prefix = "log_"

    level: Annotated[str, Meta(pattern="^(?i:debug|info|warn|warning|error|critical|fatal)$")] = "INFO"
    format: Literal["json", "console"] = "json"


class ServerSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The processes of ``gateway serve``."""

    workers: AtLeast1 = 1
    shutdown_timeout_s: Positive = 30.0
    stream_stall_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] = 60.0
    head_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 20.0
    body_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] = 60.0


class RateLimitSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Requests per second and bursts, per tenant and per user (0: no limit)."""

    env_prefix = "rate_limit_"

    tenant_rps: NotNegative = 500.0
    tenant_burst: AtLeast0 = 1000
    user_rps: NotNegative = 50.0
    user_burst: AtLeast0 = 100

    @property
    def enabled(self) -> bool:
        return self.tenant_rps > 0 or self.user_rps > 0


class MetricsSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    env_prefix = "metrics_"

    token: str | None = None
    tenant_labels: bool | None = None

    @property
    def labels_tenants(self) -> bool:
        """Whether a scrape names the tenants: as set, else only behind the scrape token (who
        may reach an open ``/metrics`` need not learn which tenants exist, or how busy they are)."""
        return self.tenant_labels if self.tenant_labels is not None else self.token is not None


class ConsoleSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The approver's console (``/console/``): how long its sessions live and when their cookie is ``Secure``."""

    env_prefix = "console_"

    session_idle_s: AtLeast1 = 1800
    session_max_s: AtLeast1 = 43_200
    secure_cookie: Literal["auto", "always", "never"] = "auto"


class OidcSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The OpenID Connect provider the console signs users in with (authorization code + PKCE)."""

    env_prefix = "oidc_"

    issuer: HttpUrl | None = None
    client_id: str | None = None
    client_secret: str | None = None
    timeout_s: Positive = 5.0

    @property
    def enabled(self) -> bool:
        return self.issuer is not None and bool(self.client_id)
class WebhookSettings(Group, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Tenants' webhooks: where their URLs may point, and how deliveries are retried."""

    env_prefix = "webhook_"
    env_names = {"public_base_url": "public_base_url"}

    public_base_url: HttpUrl = "http://127.0.0.1:8000"
    allowed_hosts: tuple[str, ...] = ()
    timeout_s: Positive = 10.0
    max_response_bytes: AtLeast1 = 4096
    retry_window_s: Positive = 86_400.0
    retry_base_s: Positive = 5.0
    retry_max_s: Positive = 3600.0
    interval_s: NotNegative = 1.0
    batch_size: AtLeast1 = 20
    lease_s: Positive = 60.0


def _group(kind: type[Group]) -> Any:
    return msgspec.field(default_factory=kind)


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """All settings. Build it with ``from_env``; in tests, ``from_flat(database_url=..., ...)`` or by groups."""

    database: DatabaseSettings = _group(DatabaseSettings)
    jwt: JwtSettings = _group(JwtSettings)
    jwks: JwksSettings = _group(JwksSettings)
    demo: bool = False
    runs: RunSettings = _group(RunSettings)
    approvals: ApprovalSettings = _group(ApprovalSettings)
    agent: AgentSettings = _group(AgentSettings)
    llm: LlmSettings = _group(LlmSettings)
    tools: ToolSettings = _group(ToolSettings)
    requests: RequestLimits = _group(RequestLimits)
    policy_cache_s: NotNegative = 5.0
    audit: AuditSettings = _group(AuditSettings)
    services: ServiceSettings = _group(ServiceSettings)
    http: HttpClientSettings = _group(HttpClientSettings)
    log: LogSettings = _group(LogSettings)
    server: ServerSettings = _group(ServerSettings)
    rate_limits: RateLimitSettings = _group(RateLimitSettings)
    metrics: MetricsSettings = _group(MetricsSettings)
    console: ConsoleSettings = _group(ConsoleSettings)
    oidc: OidcSettings = _group(OidcSettings)
    webhooks: WebhookSettings = _group(WebhookSettings)
    mcp_upstream: McpUpstreamSettings = _group(McpUpstreamSettings)

    def __post_init__(self) -> None:
        for name, group in self.groups():
            # A group built by hand (not decoded) has not met its type declarations yet.
            try:
                msgspec.convert(msgspec.to_builtins(group), type(group))
            except msgspec.ValidationError as exc:
                raise _invalid(exc, {name: msgspec.to_builtins(group)}, within=(name,)) from None
        self._check_rules_across_fields()

    def _check_rules_across_fields(self) -> None:
        """The rules no single type declaration can state; ``require_signing_setup`` adds the secret's."""
        for name, value in self.flat().items():
            # ``inf`` and ``nan`` meet gt/ge bounds (or fail them with no clear word), and a
            # timeout of either breaks the first arithmetic done with it.
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingsError(f"{env_variable(name)} must be a finite number, not {value}")
        if self.database.url is not None:
            problem = database_url_problem(self.database.url)
            if problem is not None:
                raise SettingsError(f"GATEWAY_DATABASE_URL {problem}")
        if self.jwks.url is not None:
            claims = (("GATEWAY_JWT_AUDIENCE", self.jwt.audience), ("GATEWAY_JWT_ISSUER", self.jwt.issuer))
            missing = [variable for variable, value in claims if not value]
            if missing:
                raise SettingsError(
                    f"GATEWAY_JWKS_URL is set, so {' and '.join(missing)} must be set too (the aud and iss your "
                    "identity provider puts in tokens for this gateway; without them a token it issued to another "
                    "application would be accepted)"
                )
        if self.metrics.token is not None and len(self.metrics.token.encode()) < 16:
            raise SettingsError("GATEWAY_METRICS_TOKEN must be at least 16 bytes")
        if self.oidc.issuer is not None and not self.oidc.client_id:
            raise SettingsError("GATEWAY_OIDC_CLIENT_ID must be set with GATEWAY_OIDC_ISSUER")
        if self.llm.base_url is not None and not self.llm.model:
            raise SettingsError("GATEWAY_LLM_MODEL must be set with GATEWAY_LLM_BASE_URL")
        names = {DEFAULT_PROVIDER} if self.llm.base_url is not None else set()
        for provider in self.llm.providers:
            if provider.name in names:
                raise SettingsError(
                    f"GATEWAY_LLM_PROVIDERS entry {provider.name!r}: the name is used twice "
                    "(`default` is the GATEWAY_LLM_* provider)"
                )
            names.add(provider.name)

    def require_signing_setup(self) -> None:
        """Stop start-up when no key would verify a token (outside demo mode)."""
        if self.jwt.secret is None and self.jwks.url is None:
            raise SettingsError(
                "GATEWAY_JWT_SECRET (HS256) or GATEWAY_JWKS_URL (RS256/ES256) must be set; "
                "run `gateway serve --demo` for a local demo with a generated secret"
            )
        if self.jwt.secret is not None and len(self.jwt.secret.encode()) < 32:
            raise SettingsError("GATEWAY_JWT_SECRET must be at least 32 bytes")

    def groups(self) -> Iterator[tuple[str, Group]]:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, Group):
                yield name, value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every ``GATEWAY_*`` variable; an empty one means the default."""
        env = os.environ if environ is None else environ
        raw: dict[str, Any] = {}
        for name, (group, field) in ENV_FIELDS.items():
            key = env_variable(name)
            if env.get(key, "") == "":
                continue
            value = _parse_env_value(name, _field_type(group, field), env[key])
            if name == "llm_providers":
                value = _providers_with_keys(value, env)
            if group is None:
                raw[field] = value
            else:
                raw.setdefault(group, {})[field] = value
        try:
            return msgspec.convert(raw, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise _invalid(exc, raw) from None

    @classmethod
    def from_flat(cls, **values: Any) -> Settings:
        """Settings from fields named as their variables (``database_url=...``), the rest defaults."""
        groups: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for name, value in values.items():
            if name not in ENV_FIELDS:
                raise TypeError(f"no setting is read from {env_variable(name)}")
            group, field = ENV_FIELDS[name]
            if group is None:
                top[field] = value
            else:
                groups.setdefault(group, {})[field] = value
        kinds = _group_types()
        return cls(**top, **{group: kinds[group](**fields) for group, fields in groups.items()})

    def flat(self) -> dict[str, Any]:
        """Every value under its variable's name (as in ``FIELD_DOCS``)."""
        return {
            name: getattr(self if group is None else getattr(self, group), field)
            for name, (group, field) in ENV_FIELDS.items()
        }


DATABASE_URL_QUERY = ("host", "port", "sslmode", "ssl", "target_session_attrs")
"""What a database URL's query may hold, as both of the gateway's pools take it: hosts and
ports (a socket folder, or several servers to try in turn), TLS (libpq's ``sslmode``, or
asyncpg's ``ssl``, with the same modes), and which server of several to settle on."""
REPEATABLE_QUERY = ("host", "port")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def database_url_problem(url: str) -> str | None:
    """What is wrong with a database URL that its pattern lets through, in words, or ``None``."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - a port that is no number, a URL SQLAlchemy cannot read
        return "is not a URL the driver can read (user@host:port/database)"
    if parsed.port is not None and not 0 < parsed.port < 65536:
        return f"names port {parsed.port}, which no server listens on"
    for key, value in parsed.query.items():
        if key not in DATABASE_URL_QUERY:
            return (f"takes only the query parameters {', '.join(DATABASE_URL_QUERY)}, not {key!r} "
                    "(timeouts and pool sizes are GATEWAY_DATABASE_* settings)")
        if not isinstance(value, str) and key not in REPEATABLE_QUERY:
            return f"gives {key!r} more than once"
        if key in ("ssl", "sslmode") and value not in SSL_MODES:
            return f"{key} must be one of {', '.join(SSL_MODES)}"
    return None


def env_variable(name: str) -> str:
    return ENV_PREFIX + name.upper()


@functools.cache
def _group_types() -> dict[str, type[Group]]:
    """The groups' names in ``Settings`` and their types."""
    return {
        field.name: field.type for field in msgspec.structs.fields(Settings)
        if isinstance(field.type, type) and issubclass(field.type, Group)
    }


def _env_fields() -> dict[str, tuple[str | None, str]]:
    """Each variable (``FIELD_DOCS``' key, in its order) and where its value lives: (group or None, field)."""
    found: dict[str, tuple[str | None, str]] = {}
    for name in Settings.__struct_fields__:
        kind = _group_types().get(name)
        places = [(name, (None, name))] if kind is None else [
            (kind.env_name(field), (name, field)) for field in kind.__struct_fields__
        ]
        for variable, place in places:
            if variable in found:
                raise RuntimeError(f"{env_variable(variable)} would set two settings")
            found[variable] = place
    if set(found) != set(FIELD_DOCS):
        raise RuntimeError(f"settings and FIELD_DOCS disagree: {sorted(set(found) ^ set(FIELD_DOCS))}")
    return {name: found[name] for name in FIELD_DOCS}


def _field(group: str | None, field: str) -> mi.Field:
    kind = Settings if group is None else _group_types()[group]
    info = mi.type_info(kind)
    assert isinstance(info, mi.StructType)
    return next(f for f in info.fields if f.name == field)


def _field_type(group: str | None, field: str) -> mi.Type:
    return _without_none(_field(group, field).type)


def _without_none(info: mi.Type) -> mi.Type:
    if isinstance(info, mi.UnionType):
        kinds = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(kinds) == 1:
            return kinds[0]
    return info


def _providers_with_keys(value: Any, env: Mapping[str, str]) -> Any:
    """Each provider's API key comes from the environment variable its ``api_key_env`` names."""
    if not isinstance(value, list):
        raise SettingsError(MESSAGES["llm_providers"])
    for entry in value:
        if isinstance(entry, dict) and entry.get("api_key_env") and not entry.get("api_key"):
            entry["api_key"] = env.get(str(entry["api_key_env"])) or None
    return value


def _parse_env_value(name: str, info: mi.Type, value: str) -> Any:
    if isinstance(info, mi.VarTupleType) and isinstance(info.item_type, mi.StructType):
        try:
            return msgspec.json.decode(value)
        except msgspec.DecodeError:
            raise SettingsError(f"{env_variable(name)} must be JSON") from None
    if isinstance(info, mi.VarTupleType):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(info, mi.BoolType):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{env_variable(name)} must be true or false")
    return value


# Where a type declaration alone would make a poor message.
MESSAGES = {
    "database_url": "GATEWAY_DATABASE_URL must start with postgresql+asyncpg://: the gateway needs PostgreSQL "
    "(unset GATEWAY_DATABASE_URL to use the embedded one, started from ./.gateway/postgres)",
    "jwt_algorithms": f"GATEWAY_JWT_ALGORITHMS may only name {', '.join(JWT_ALGORITHMS)}; 'none' is never allowed",
    "llm_providers": "GATEWAY_LLM_PROVIDERS must be a JSON list of providers",
    "log_level": "GATEWAY_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL",
}
PATTERNS = {HTTP_URL: "an http(s) URL"}
_PATH_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")


def _invalid(exc: msgspec.ValidationError, data: Any, *, within: tuple[str, ...] = ()) -> SettingsError:
    """A decoding error, said in one line that names the variable and what it must be."""
    what, _, where = str(exc).rpartition(" - at `")
    what = what or str(exc)
    path: list[str | int] = [*within]
    for field, index in _PATH_STEP.findall(where.removeprefix("$").rstrip("`")):
        path.append(field or int(index))
    groups = _group_types()
    if len(path) >= 2 and path[0] in groups:
        group, field = str(path[0]), str(path[1])
        name = groups[group].env_name(field)
    elif len(path) == 1 and path[0] in Settings.__struct_fields__:
        group, field = None, str(path[0])
        name = field
    else:
        return SettingsError(f"the settings are invalid: {what}")
    if name == "llm_providers" and len(path) >= 3:
        return _invalid_provider(what, data, path[2], path[3:])
    if name in MESSAGES:
        return SettingsError(MESSAGES[name])
    return SettingsError(f"{env_variable(name)} must be {_describe(_field_type(group, field))}")


def _invalid_provider(what: str, data: Any, index: Any, rest: list[str | int]) -> SettingsError:
    try:
        name = data["llm"]["providers"][index]["name"]
    except (KeyError, IndexError, TypeError):
        name = index
    where = f"GATEWAY_LLM_PROVIDERS entry {name!r}"
    fields = {f.name: f for f in mi.type_info(LlmProvider).fields}  # type: ignore[attr-defined]
    if rest and rest[0] in fields:
        return SettingsError(f"{where}: {rest[0]} must be {_describe(_without_none(fields[str(rest[0])].type))}")
    return SettingsError(f"{where}: {what[:1].lower()}{what[1:]}")


def _describe(info: mi.Type) -> str:
    """What a value of this declared type must be, in words: ``an integer at least 1``."""
    if isinstance(info, mi.LiteralType):
        return " or ".join(str(value) for value in info.values)
    if isinstance(info, mi.BoolType):
        return "true or false"
    if isinstance(info, mi.StrType):
        return PATTERNS.get(info.pattern or "", f"text matching {info.pattern}" if info.pattern else "text")
    if isinstance(info, mi.VarTupleType):
        return "a comma-separated list"
    if isinstance(info, (mi.IntType, mi.FloatType)):
        bounds = [f"{words} {limit}" for words, limit in (
            ("at least", info.ge), ("more than", info.gt), ("at most", info.le), ("less than", info.lt))
            if limit is not None]
        return " ".join(["an integer" if isinstance(info, mi.IntType) else "a number", " and ".join(bounds)]).strip()
    return "valid"


FIELD_DOCS: dict[str, str] = {
    "database_url": "PostgreSQL server: `postgresql+asyncpg://user@host/db`, with `?sslmode=` (libpq's modes) for "
    "TLS and `?host=` for a socket folder. Unset: the embedded PostgreSQL.",
    "embedded_data_dir": "Without `GATEWAY_DATABASE_URL`: the data folder of the embedded PostgreSQL, which "
                         "`gateway` commands start (Unix socket only) and stop.",
    "database_pool_size": "Connections per process in the database pool.",
    "database_pool_timeout_s": "Seconds to wait for a pooled connection before answering 503.",
    "database_statement_timeout_s": "Seconds a single database statement may run.",
    "database_idle_in_transaction_timeout_s": "Seconds a gateway session may sit idle inside a transaction before "
    "PostgreSQL ends it (`idle_in_transaction_session_timeout`), so no stalled caller holds a connection and its locks.",
    "database_group_commit_lanes": "Grouped statements of the tool-call path in flight at once per process, for "
    "admissions and for records each; every lane keeps one connection of its own (docs/performance.md#group-commit).",
    "database_group_commit_max_requests": "Most requests one grouped statement serves; more wait for the next one.",
    "database_group_commit_overflow_after_s": "Seconds each earlier lane must have been busy with its statement before "
    "a further lane sends (at once when more requests wait than one statement takes): until then requests gather "
    "behind the first lane, in larger groups; a statement waiting on a lock holds up the requests queued behind it no "
    "longer than this (`0`: every lane sends whenever it is free; at most 1).",
    "database_pgbouncer": "`true` when `GATEWAY_DATABASE_URL` points at PgBouncer in transaction pooling mode: "
    "no named prepared statements, no session settings at connect (docs/operations.md#pgbouncer).",
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
    "llm_kind": "Kind of the default model provider: `openai` (any OpenAI-compatible API) or `ollama` (native); "
    "`demo`, the scripted demo model, only in demo mode (which offers it anyway when no provider is set).",
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
    "llm_max_requests_per_tenant": "Model requests one tenant has in flight at once in one process; its further "
    "requests wait their turn (within their run's time limit) while other tenants' go on, so one tenant's slow "
    "chats never hold the whole model pool (`GATEWAY_HTTP_MAX_CONNECTIONS`).",
    "llm_history_share": "Share of the context window the prompt may fill before the oldest exchanges are dropped.",
    "tool_timeout_s": "Default per-call timeout of a tool that declares none.",
    "tool_max_result_bytes": "Default result size limit of a tool that declares none.",
    "tool_max_remote_calls_per_tenant": "Calls of HTTP and MCP tools (to business services and MCP servers) one "
    "tenant has in flight at once in one process; its further calls wait their turn within their own timeout while "
    "other tenants' go on, so one tenant's calls to a slow service never hold a whole connection pool.",
    "max_body_bytes": "Largest request body accepted (413 `PAYLOAD_TOO_LARGE` above).",
    "max_head_bytes": "Largest request line and headers accepted together (`431 HEADERS_TOO_LARGE` above, the "
    "connection closed): `gateway serve` only, checked as the bytes arrive.",
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
    "audit_verify_max_per_tenant": "Chain verifications (the console's *Verify chain*) one tenant may run at once "
    "in one process; one more is `429 RATE_LIMITED` with `Retry-After`. A verification holds a database "
    "connection for its one snapshot and hashes every row.",
    "audit_verify_max_per_process": "Chain verifications one process runs at once, all tenants together; one more "
    "is `429 RATE_LIMITED` with `Retry-After`.",
    "tools_file": "A TOML or YAML file declaring HTTP tools (see [HTTP tools](http-tools.md)); checked at start.",
    "service_base_urls": "Comma-separated `NAME=URL` base URLs of the business services; they override the "
    "tools file's `base_url` and, with it, are the only hosts HTTP tools can reach.",
    "service_signing_key": "PEM private key (EC P-256 → ES256, or RSA → RS256) the gateway signs service tokens "
    "with; `\\n` may stand for line breaks. Required when HTTP tools are declared (demo mode generates one). "
    "It also signs and checks audit anchors (`gateway audit anchor`, `audit verify --anchor`).",
    "service_signing_key_file": "Path of a PEM file holding that key (instead of `GATEWAY_SERVICE_SIGNING_KEY`).",
    "service_token_issuer": "The `iss` claim of service tokens.",
    "service_token_ttl_s": "Lifetime of a service token, in seconds.",
    "http_max_connections": "Most connections the process opens to business services (HTTP tools), in total; "
    "model providers have a pool of their own of the same size, and the identity provider (JWKS, OIDC) one of 10, "
    "so slow model answers never hold the connections tools or sign-ins need.",
    "http_max_keepalive_connections": "Idle connections the HTTP client keeps open for reuse, in total (past that "
    "the least recently used is closed).",
    "http_connect_timeout_s": "Timeout to open a connection to a business service, in seconds (the call as a "
    "whole is bounded by the tool's timeout).",
    "log_level": "Log level: DEBUG, INFO, WARNING, ERROR, CRITICAL (any case; WARN and FATAL too).",
    "log_format": "`json` (one event per line) or `console` (for a terminal).",
    "workers": "Worker processes of `gateway serve` (`--workers` overrides); all state is in the database.",
    "shutdown_timeout_s": "On SIGTERM, seconds in-flight requests get to finish before they are cancelled.",
    "stream_stall_timeout_s": "Seconds a streamed answer (an audit export, a streamed chat) waits for room to send "
    "its next 16 KiB; a client that stops taking the body for that long has its stream ended (the connection "
    "closed before the body's end) and what it held given back (an export's slot; a chat's run is stored as "
    "cancelled). A client reading at least about a third of the socket's send buffer per period (Linux: at most "
    "4 MiB, so ~1.4 MB per 60 s) is never cut, however long the stream takes.",
    "head_timeout_s": "Seconds a request's line and headers get to arrive, from their first byte (or the "
    "connection's opening): later is `408 INVALID_REQUEST`, a connection that sent nothing is closed "
    "(`gateway serve` only; a client holding connections open by sending a head slowly is cut).",
    "body_timeout_s": "Seconds a request's body gets to arrive after its head (`gateway serve` only); a body still "
    "coming then has its connection closed, also when the request was answered before its body arrived (a 401, "
    "404 or 413; the rest is read and dropped until then).",
    "rate_limit_tenant_rps": "Requests per second a tenant may make, across all processes (0: no limit). A "
    "request counts once however many tool calls its batch holds (at most `GATEWAY_MAX_BATCH_SIZE`).",
    "rate_limit_tenant_burst": "Requests a tenant may make at once above its rate (0: one second's worth).",
    "rate_limit_user_rps": "Requests per second one user of a tenant may make, across all processes (0: no limit).",
    "rate_limit_user_burst": "Requests a user may make at once above their rate (0: one second's worth).",
    "metrics_token": "When set, `GET /metrics` answers only a request bearing it (`Authorization: Bearer ...`; "
    "Prometheus' `authorization` setting); otherwise anyone who reaches the route may scrape.",
    "metrics_tenant_labels": "`true`: metrics carry a tenant label (`gateway_approvals_pending` per tenant); "
    "`false`: none (one sum), so a scrape does not list the tenants. Unset: labels only when "
    "`GATEWAY_METRICS_TOKEN` is set.",
    "console_session_idle_s": "Console: seconds a session may go unused before it ends (sign in again).",
    "console_session_max_s": "Console: seconds after sign-in a session ends however much it is used.",
    "console_secure_cookie": "Console: `auto` marks the session cookie `Secure` when the request came over HTTPS; "
    "`always` (behind a TLS-terminating proxy) or `never`.",
    "oidc_issuer": "Console sign-in: the OpenID Connect issuer; its discovery document "
    "(`/.well-known/openid-configuration`) gives the endpoints and keys. Unset: sign-in with a token.",
    "oidc_client_id": "Console sign-in: the client id registered with the issuer (the ID token's `aud`).",
    "oidc_client_secret": "Console sign-in: the client secret, sent to the token endpoint; never logged.",
    "oidc_timeout_s": "Console sign-in: timeout of each request to the OpenID Connect provider, in seconds.",
    "public_base_url": "The gateway's address as people reach it (`https://gateway.example.com`): webhooks link to "
    "`<this>/console/approvals/<id>`.",
    "webhook_allowed_hosts": "Comma-separated hosts (names or addresses) a webhook URL may name over plain `http` "
    "or at a loopback or private address (development); every other webhook needs `https` and a public address. An "
    "exemption, not an allow-list: every tenant's webhooks may then reach a listed host on any port and path, and "
    "read each delivery's status: list only receivers meant for that.",
    "webhook_timeout_s": "Seconds one webhook delivery may take in all (connect, send, read the answer).",
    "webhook_max_response_bytes": "Most bytes of a receiver's answer read; the rest is not waited for.",
    "webhook_retry_window_s": "Seconds a webhook delivery is retried (backoff with jitter) before it is "
    "dead-lettered; a manual retry starts a new window.",
    "webhook_retry_base_s": "First retry delay of a webhook delivery in seconds, doubled each attempt (with jitter).",
    "webhook_retry_max_s": "Longest delay between two attempts of a webhook delivery, in seconds.",
    "webhook_interval_s": "Seconds the webhook worker of each process waits before it looks again for due "
    "deliveries when it has a free slot (and between its sweeps for expired approvals); `0` turns the "
    "process's worker off.",
    "webhook_batch_size": "Most webhook deliveries one process sends at once; a slot is claimed again as soon "
    "as its delivery ends, tenants taking turns.",
    "webhook_lease_s": "Seconds a claimed webhook delivery is reserved for its process; after that another may "
    "send it again (a process that died mid-send).",
    "mcp_refresh_s": "Seconds between two listings of the tools of each MCP server of the tools file "
    "(see [MCP servers](mcp-servers.md)): a tool added, changed or removed upstream, or a server back up, shows "
    "within this time.",
    "mcp_list_timeout_s": "Timeout of opening a session with an MCP server and listing its tools, in seconds.",
}


ENV_FIELDS = _env_fields()


def markdown_table() -> str:
    """The settings table of docs/configuration.md, generated from the fields and ``FIELD_DOCS``."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, (group, field) in ENV_FIELDS.items():
        default = _field(group, field).default
        if isinstance(default, tuple):
            default = ",".join(default) or None
        shown = "(none)" if default is None else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        lines.append(f"| `{env_variable(name)}` | {shown} | {FIELD_DOCS[name]} |")
    return "\n".join(lines)
