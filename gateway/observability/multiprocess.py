"""The directory where worker processes keep their Prometheus metrics (multiprocess mode).

Kept apart from ``metrics`` on purpose: it must run before prometheus-client is first
imported, because prometheus-client decides at import whether it is in multiprocess mode.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_metrics_dir(workers: int) -> Path | None:
    """Point ``PROMETHEUS_MULTIPROC_DIR`` at an empty directory when several workers will share it.

    An operator's own ``PROMETHEUS_MULTIPROC_DIR`` is honoured and emptied of the last run's
    files (prometheus-client requires a clean directory per run); otherwise, with more than
    one worker, a fresh temporary directory is made. Returns a directory to remove at exit,
    if this function made one.
    """
    configured = os.environ.get(ENV)
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        return None
    if workers <= 1:
        return None
    made = Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
    os.environ[ENV] = str(made)
    return made


def remove_metrics_dir(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(ENV, None)
