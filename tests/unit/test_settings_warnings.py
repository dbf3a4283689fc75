"""`gateway serve` warns about settings that are allowed but defeat a promise the gateway makes."""

from __future__ import annotations

from gateway.cli import warn_about_settings
from gateway.settings import Settings
from tests.support.logs import CapturedLogs


def test_turns_as_many_as_one_services_share_of_the_pool_are_warned_about(logs: CapturedLogs):
    # Three connections: one service may have two, as many as one tenant's turns.
    warn_about_settings(Settings.from_flat(http_max_connections=3, tool_max_remote_calls_per_tenant=2))
    (warning,) = logs.named("one_tenant_can_fill_a_service")
    assert warning["connections_per_service"] == 2 and warning["tool_max_remote_calls_per_tenant"] == 2


def test_turns_fewer_than_one_services_share_pass_quietly(logs: CapturedLogs):
    warn_about_settings(Settings.from_flat(http_max_connections=4, tool_max_remote_calls_per_tenant=2))
    warn_about_settings(Settings.from_flat())
    assert logs.named("one_tenant_can_fill_a_service") == []


def test_a_shutdown_shorter_than_a_call_is_warned_about(logs: CapturedLogs):
    warn_about_settings(Settings.from_flat(shutdown_timeout_s=1, tool_timeout_s=30))
    (warning,) = logs.named("shutdown_timeout_shorter_than_a_call")
    assert warning["shutdown_timeout_s"] == 1 and warning["longest_call_s"] > 30
