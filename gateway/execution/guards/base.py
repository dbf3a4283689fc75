"""What a guard is: one rule about a tool call, with the code the model sees when it refuses.

A guard works at one of three stages of a call:

- ``CHECK``: in Python, before the database. ``check(plan, context)`` returns the message
  of its refusal, or ``None`` to pass (it may fill in the plan: the tool, the arguments).
- ``ADMISSION``: in the one admission statement of the batch (``gateway_admit_calls``),
  because what it decides must be exact across replicas. ``prepare(plan, policy)`` decides
  its inputs in Python; ``contribute(plan, payload)`` writes them into the call's part of
  the statement; ``contents`` are the answers the statement gives when it refuses.
- ``EXECUTION``: around the tool's handler. ``around(call)`` returns the wrapped call.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.auth.principal import Principal
from gateway.errors import ErrorCode
from gateway.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from gateway.db.policies import ToolPolicy
    from gateway.execution.checks import CallPlan
    from gateway.tools.base import Tool, ToolContext


class Stage(enum.Enum):
    CHECK = "check"
    ADMISSION = "admission"
    EXECUTION = "execution"


class CheckContext(NamedTuple):
    """What the checks of one batch need besides the call itself."""

    registry: ToolRegistry
    principal: Principal
    max_json_depth: int


Check = Callable[["CallPlan", CheckContext], "str | None"]
Prepare = Callable[["CallPlan", "ToolPolicy"], None]
Contribute = Callable[["CallPlan", dict[str, Any]], None]
Call = Callable[["Tool", Any, "ToolContext"], Awaitable[Any]]
"""A tool's handler as the execution guards see it: (tool, decoded arguments, context) -> result."""
Around = Callable[[Call], Call]


@dataclass(frozen=True, slots=True)
class Guard:
    name: str
    stage: Stage
    code: ErrorCode | None
    """What the model sees when this guard refuses (``None``: it never refuses, e.g. the result cap)."""
    check: Check | None = None
    timed_as: int = 0
    """The ``StageTimer`` stage its check is charged to."""
    prepare: Prepare | None = None
    contribute: Contribute | None = None
    contents: Mapping[str, str] = field(default_factory=dict)
    around: Around | None = None
