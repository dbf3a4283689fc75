"""One rule each for a tool's effective limits and for what a caller may see and call."""

from __future__ import annotations

from dataclasses import replace

from gateway.db.policies import DEFAULT_POLICY, ToolPolicy
from gateway.execution.policy import MAX_POLICY_TIMEOUT_S, ToolLimits, longest_timeout_s, tool_limits
from gateway.tools.builtin import builtin_tools
from gateway.tools.registry import ToolRegistry

REGISTRY = ToolRegistry(builtin_tools())
ADD = REGISTRY.get("add")


def test_without_a_policy_a_tool_keeps_its_own_limits_and_none_means_the_gateway_default():
    declared = replace(ADD, timeout_s=2.0, max_result_bytes=512)
    assert tool_limits(declared, DEFAULT_POLICY) == ToolLimits(timeout_s=2.0, max_result_bytes=512, max_calls_per_run=None)
    assert tool_limits(ADD, DEFAULT_POLICY) == ToolLimits(timeout_s=None, max_result_bytes=None, max_calls_per_run=None)


def test_a_policy_replaces_only_the_limits_it_sets():
    declared = replace(ADD, timeout_s=2.0, max_result_bytes=512)
    policy = ToolPolicy(timeout_s=30.0, max_calls_per_run=4)
    assert tool_limits(declared, policy) == ToolLimits(timeout_s=30.0, max_result_bytes=512, max_calls_per_run=4)


def test_no_call_runs_longer_than_the_longest_timeout():
    assert longest_timeout_s(REGISTRY, 10.0) == MAX_POLICY_TIMEOUT_S
    slow = replace(ADD, name="slow", timeout_s=3000.0)
    assert longest_timeout_s([*REGISTRY, slow], 10.0) == 3000.0
    assert longest_timeout_s(REGISTRY, 900.0) == 900.0
