"""Settings: read once from GATEWAY_* variables, validated, documented."""

from __future__ import annotations

import msgspec
import pytest

from gateway.settings import ENV_FIELDS, FIELD_DOCS, RequestLimits, Settings, SettingsError

SECRET = "s" * 32


def test_defaults_need_no_environment():
    settings = Settings.from_env({})
    assert settings.database.url is None  # the embedded PostgreSQL
    assert settings.database.embedded_data_dir == ".gateway/postgres"
    assert settings.approvals.ttl_s == 86_400
    assert settings.requests.max_body_bytes == 1_048_576
    assert settings.approvals.allow_self_approval is False
    assert "none" not in {a.lower() for a in settings.jwt.algorithms}


def test_every_field_is_read_from_its_gateway_variable():
    settings = Settings.from_env(
        {
            "GATEWAY_DATABASE_URL": "postgresql+asyncpg://u@h/db",
            "GATEWAY_RUN_MAX_TOOL_CALLS": "7",
            "GATEWAY_TOOL_TIMEOUT_S": "2.5",
            "GATEWAY_ALLOW_SELF_APPROVAL": "yes",
            "GATEWAY_JWT_ALGORITHMS": "RS256, ES256",
            "GATEWAY_JWT_ISSUER": "https://id.example",
        }
    )
    assert settings.database.url == "postgresql+asyncpg://u@h/db"
    assert settings.runs.max_tool_calls == 7
    assert settings.tools.timeout_s == 2.5
    assert settings.approvals.allow_self_approval is True
    assert settings.jwt.algorithms == ("RS256", "ES256")
    assert settings.jwt.issuer == "https://id.example"


def test_an_empty_variable_means_the_default():
    assert Settings.from_env({"GATEWAY_RUN_MAX_TOOL_CALLS": ""}).runs.max_tool_calls == 50


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GATEWAY_RUN_MAX_TOOL_CALLS", "many"),
        ("GATEWAY_RUN_MAX_TOOL_CALLS", "0"),
        ("GATEWAY_ALLOW_SELF_APPROVAL", "perhaps"),
        ("GATEWAY_DATABASE_URL", "mysql://u@h/db"),
        ("GATEWAY_JWT_ALGORITHMS", "none"),
        ("GATEWAY_JWT_ALGORITHMS", "HS256,none"),
        ("GATEWAY_LOG_FORMAT", "xml"),
        ("GATEWAY_MAX_BODY_BYTES", "0"),
        ("GATEWAY_MAX_JSON_DEPTH", "0"),
        ("GATEWAY_MAX_JSON_DEPTH", "513"),
    ],
)
def test_an_invalid_value_stops_start_up_naming_the_variable(name, value):
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({name: value})
    assert name in str(caught.value)


def test_a_sqlite_url_stops_start_up_saying_postgresql_is_required_and_how_to_get_it():
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"GATEWAY_DATABASE_URL": "sqlite+aiosqlite:///./gateway.db"})
    message = str(caught.value)
    assert "PostgreSQL" in message and "unset GATEWAY_DATABASE_URL" in message and "embedded" in message
    assert "\n" not in message


def test_a_missing_secret_stops_start_up_with_a_clear_message():
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({}).require_signing_setup()
    assert "GATEWAY_JWT_SECRET" in str(caught.value) and "--demo" in str(caught.value)


def test_a_short_secret_stops_start_up():
    with pytest.raises(SettingsError):
        Settings.from_env({"GATEWAY_JWT_SECRET": "short"}).require_signing_setup()


def test_a_secret_or_a_jwks_url_is_enough():
    Settings.from_env({"GATEWAY_JWT_SECRET": SECRET}).require_signing_setup()
    Settings.from_env({
        "GATEWAY_JWKS_URL": "https://id.example/jwks", "GATEWAY_JWT_AUDIENCE": "gateway",
        "GATEWAY_JWT_ISSUER": "https://id.example",
    }).require_signing_setup()


def test_settings_are_frozen():
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.demo = True  # type: ignore[misc]


def test_unknown_fields_are_refused():
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"no_such_setting": 1}, Settings)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"database": {"no_such_setting": 1}}, Settings)
    with pytest.raises(TypeError, match="GATEWAY_NO_SUCH_SETTING"):
        Settings.from_flat(no_such_setting=1)


def test_every_field_is_documented_and_read_from_one_variable_in_the_documented_order():
    assert list(ENV_FIELDS) == list(FIELD_DOCS)
    places = set(ENV_FIELDS.values())
    assert len(places) == len(ENV_FIELDS)
    for group, fields in Settings().groups():
        assert {(group, field) for field in fields.__struct_fields__} <= places


def test_flat_names_reach_the_same_values_as_the_variables():
    settings = Settings.from_flat(tool_timeout_s=2.5, tools_file="tools.toml", allow_self_approval=True, demo=True)
    assert (settings.tools.timeout_s, settings.tools.file, settings.approvals.allow_self_approval) == (
        2.5, "tools.toml", True)
    assert settings.demo is True
    assert settings.flat() == {**Settings().flat(), "tool_timeout_s": 2.5, "tools_file": "tools.toml",
                               "allow_self_approval": True, "demo": True}


def test_a_group_built_by_hand_meets_its_type_declarations_naming_the_variable():
    with pytest.raises(SettingsError, match="^GATEWAY_MAX_JSON_DEPTH must be an integer at least 1 and at most 512$"):
        Settings(requests=RequestLimits(max_json_depth=0))
    with pytest.raises(SettingsError, match="^GATEWAY_WORKERS must be an integer at least 1$"):
        Settings.from_flat(workers=0)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GATEWAY_RUN_MAX_TOOL_CALLS", "many", "GATEWAY_RUN_MAX_TOOL_CALLS must be an integer at least 1"),
        ("GATEWAY_LLM_HISTORY_SHARE", "0", "GATEWAY_LLM_HISTORY_SHARE must be a number more than 0 and at most 1"),
        ("GATEWAY_RATE_LIMIT_USER_RPS", "-1", "GATEWAY_RATE_LIMIT_USER_RPS must be a number at least 0"),
        ("GATEWAY_LOG_FORMAT", "xml", "GATEWAY_LOG_FORMAT must be console or json"),
        ("GATEWAY_DATABASE_GROUP_COMMIT_LANES", "0",
         "GATEWAY_DATABASE_GROUP_COMMIT_LANES must be an integer at least 1 and at most 16"),
        ("GATEWAY_DATABASE_GROUP_COMMIT_MAX_REQUESTS", "lots",
         "GATEWAY_DATABASE_GROUP_COMMIT_MAX_REQUESTS must be an integer at least 1 and at most 1000"),
        ("GATEWAY_DATABASE_GROUP_COMMIT_OVERFLOW_AFTER_S", "5",
         "GATEWAY_DATABASE_GROUP_COMMIT_OVERFLOW_AFTER_S must be a number at least 0 and at most 1"),
        ("GATEWAY_DATABASE_GROUP_COMMIT_OVERFLOW_AFTER_S", "nan",
         "GATEWAY_DATABASE_GROUP_COMMIT_OVERFLOW_AFTER_S must be a number at least 0 and at most 1"),
        ("GATEWAY_LLM_BASE_URL", "ftp://x", "GATEWAY_LLM_BASE_URL must be an http(s) URL"),
        ("GATEWAY_SHUTDOWN_TIMEOUT_S", "inf", "GATEWAY_SHUTDOWN_TIMEOUT_S must be a finite number, not inf"),
        ("GATEWAY_JWKS_TIMEOUT_S", "inf", "GATEWAY_JWKS_TIMEOUT_S must be a finite number, not inf"),
        ("GATEWAY_TOOL_TIMEOUT_S", "nan", "GATEWAY_TOOL_TIMEOUT_S must be a number more than 0"),
        ("GATEWAY_TOOL_TIMEOUT_S", "0", "GATEWAY_TOOL_TIMEOUT_S must be a number more than 0"),
        ("GATEWAY_DATABASE_POOL_SIZE", "-1", "GATEWAY_DATABASE_POOL_SIZE must be an integer at least 1"),
        ("GATEWAY_DATABASE_STATEMENT_TIMEOUT_S", "-1",
         "GATEWAY_DATABASE_STATEMENT_TIMEOUT_S must be a number at least 0.001 and at most 86400"),
        ("GATEWAY_DATABASE_STATEMENT_TIMEOUT_S", "0.0001",
         "GATEWAY_DATABASE_STATEMENT_TIMEOUT_S must be a number at least 0.001 and at most 86400"),
        ("GATEWAY_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S", "3e6",
         "GATEWAY_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S must be a number at least 0.001 and at most 86400"),
        ("GATEWAY_POLICY_CACHE_S", "-5", "GATEWAY_POLICY_CACHE_S must be a number at least 0"),
        ("GATEWAY_STREAM_STALL_TIMEOUT_S", "0",
         "GATEWAY_STREAM_STALL_TIMEOUT_S must be a number more than 0 and at most 86400"),
        ("GATEWAY_LOG_LEVEL", "FOO", "GATEWAY_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL"),
        ("GATEWAY_DATABASE_URL", "postgresql+asyncpg://u@h:notaport/db",
         "GATEWAY_DATABASE_URL is not a URL the driver can read (user@host:port/database)"),
        ("GATEWAY_DATABASE_URL", "postgresql+asyncpg://u@h:99999/db",
         "GATEWAY_DATABASE_URL names port 99999, which no server listens on"),
        ("GATEWAY_DATABASE_URL", "postgresql+asyncpg://u@h/db?connect_timeout=5",
         "GATEWAY_DATABASE_URL takes only the query parameters host, port, sslmode, ssl, target_session_attrs, "
         "not 'connect_timeout' "
         "(timeouts and pool sizes are GATEWAY_DATABASE_* settings)"),
        ("GATEWAY_DATABASE_URL", "postgresql+asyncpg://u@h/db?sslmode=on",
         "GATEWAY_DATABASE_URL sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full"),
        ("GATEWAY_DATABASE_URL", "postgresql+asyncpg://u@h/db?ssl=require&ssl=disable",
         "GATEWAY_DATABASE_URL gives 'ssl' more than once"),
    ],
)
def test_a_declared_bound_is_said_in_one_line_naming_the_variable(name, value, message):
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({name: value})
    assert str(caught.value) == message


def test_secrets_in_every_group_are_redacted_in_the_repr():
    secrets = {"jwt_secret": "j" * 40, "llm_api_key": "sk-live-key", "service_signing_key": "PEM-KEY-TEXT",
               "metrics_token": "m" * 20}
    settings = Settings.from_flat(**secrets)
    for shown in (repr(settings), repr(settings.jwt), repr(settings.llm), repr(settings.services),
                  repr(settings.metrics)):
        assert not any(secret in shown for secret in secrets.values())
    assert repr(settings).count("[REDACTED]") == len(secrets)


@pytest.mark.parametrize(
    ("present", "missing"),
    [
        ({}, ["GATEWAY_JWT_AUDIENCE", "GATEWAY_JWT_ISSUER"]),
        ({"GATEWAY_JWT_ISSUER": "https://id.example"}, ["GATEWAY_JWT_AUDIENCE"]),
        ({"GATEWAY_JWT_AUDIENCE": "gateway"}, ["GATEWAY_JWT_ISSUER"]),
    ],
)
def test_a_jwks_url_without_audience_and_issuer_stops_start_up_naming_them(present, missing):
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"GATEWAY_JWKS_URL": "https://id.example/jwks", **present})
    message = str(caught.value)
    assert "\n" not in message
    assert all(name in message for name in missing)
    assert all(name not in message for name in {"GATEWAY_JWT_AUDIENCE", "GATEWAY_JWT_ISSUER"} - set(missing))


def test_the_token_lifetime_cap_defaults_to_a_day_and_must_be_positive():
    assert Settings.from_env({}).jwt.max_lifetime_s == 86_400
    with pytest.raises(SettingsError, match="GATEWAY_JWT_MAX_LIFETIME_S"):
        Settings.from_env({"GATEWAY_JWT_MAX_LIFETIME_S": "0"})


def test_the_json_depth_limit_defaults_to_64_and_is_read_from_its_variable():
    assert Settings.from_env({}).requests.max_json_depth == 64
    assert Settings.from_env({"GATEWAY_MAX_JSON_DEPTH": "200"}).requests.max_json_depth == 200


@pytest.mark.parametrize(
    "url",
    ["postgresql+asyncpg://u@h/db?sslmode=verify-full", "postgresql+asyncpg://u@h:6432/db?ssl=require",
     "postgresql+asyncpg://u@/db?host=/run/postgresql&port=5433",
     "postgresql+asyncpg://u@/db?host=h1:5432&host=h2:5432&target_session_attrs=read-write"],
)
def test_tls_modes_and_socket_folders_are_database_urls_the_gateway_takes(url):
    assert Settings.from_env({"GATEWAY_DATABASE_URL": url}).database.url == url


@pytest.mark.parametrize("level", ["debug", "INFO", "Warn", "warning", "ERROR", "critical", "FATAL"])
def test_a_log_level_is_taken_in_any_case_by_any_of_its_names(level):
    assert Settings.from_env({"GATEWAY_LOG_LEVEL": level}).log.level == level
