"""Pinning a benchmark's processes to cores of their own with ``taskset`` (Linux), so that
the servers, PostgreSQL and wrk do not take turns on the same cores.

A plan for N server workers gives them N cores, PostgreSQL ``ceil(N / 2)`` (it spends about
half the gateway's CPU per call, bench/cpu_per_call.py) and wrk one; on a machine with fewer
cores than that, pinning would only move the contention around, and the plan says so.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass

from bench.cpu_per_call import parent_pid


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Plan:
    servers: list[int]
    postgres: list[int]
    wrk: list[int]

    def describe(self) -> str:
        return f"workers on cores {_cpus(self.servers)}, PostgreSQL on {_cpus(self.postgres)}, wrk on {_cpus(self.wrk)}"


def plan_for(workers: int, cores: list[int]) -> Plan | str:
    """Separate cores for ``workers`` server workers, PostgreSQL and wrk, or why not."""
    postgres = max(1, math.ceil(workers / 2))
    needed = workers + postgres + 1
    if shutil.which("taskset") is None:
        return "taskset is missing (Debian: util-linux)"
    if len(cores) < needed:
        return (f"too few cores to pin {workers} worker(s) meaningfully: they, PostgreSQL and wrk need "
                f"{workers} + {postgres} + 1 = {needed} cores, this machine has {len(cores)}")
    return Plan(servers=cores[:workers], postgres=cores[workers:workers + postgres],
                wrk=cores[workers + postgres:workers + postgres + 1])


def tree(root: int) -> list[int]:
    """A process and every process below it that is alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(parent_pid(int(entry)), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def pin(root: int, cores: list[int]) -> int:
    """Pin a process, all its threads and every process below it to ``cores``; processes it
    starts later inherit the affinity (a postmaster's new backends do). How many were pinned."""
    pinned = 0
    for pid in tree(root):
        done = subprocess.run(["taskset", "-a", "-p", "-c", _cpus(cores), str(pid)], capture_output=True)
        pinned += done.returncode == 0  # a process may end between the listing and taskset
    return pinned


def wrk_prefix(plan: Plan | None) -> list[str]:
    """What to start wrk under: taskset on the plan's wrk core, or nothing."""
    return [] if plan is None else ["taskset", "-c", _cpus(plan.wrk)]


def _cpus(cores: list[int]) -> str:
    return ",".join(str(core) for core in cores)
