"""`gateway serve --workers N`: several processes behind one port, demo mode included."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx

from gateway.cli import build_parser
from gateway.db.embedded import EmbeddedPostgres
from gateway.observability.multiprocess import ENV, prepare_metrics_dir, remove_metrics_dir
from tests.support.processes import start_gateway, wait_until_ready

DEMO_TOKEN = re.compile(r"acme/alice \(member\):\n\s+(\S+)")


def test_serve_takes_workers_and_can_leave_migrations_to_their_own_command() -> None:
    args = build_parser().parse_args(["serve", "--workers", "4", "--no-migrate"])
    assert args.workers == 4 and args.no_migrate
    assert build_parser().parse_args(["serve"]).workers is None  # GATEWAY_WORKERS decides


def test_several_workers_get_a_fresh_metrics_directory_and_one_worker_none(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(ENV, raising=False)
    assert prepare_metrics_dir(1) is None
    assert ENV not in os.environ
    made = prepare_metrics_dir(3)
    assert made is not None and os.environ[ENV] == str(made) and not any(made.iterdir())
    remove_metrics_dir(made)
    assert not made.exists() and ENV not in os.environ


def test_an_operators_metrics_directory_is_emptied_of_the_last_run(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "counter_123.db").write_bytes(b"stale")
    monkeypatch.setenv(ENV, str(tmp_path))
    assert prepare_metrics_dir(2) is None
    assert not list(tmp_path.glob("*.db"))


def test_demo_mode_passes_its_secret_and_its_one_embedded_server_to_every_worker(reachable_tmp: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GATEWAY_", "PROMETHEUS_"))}
    gateway = start_gateway(env, reachable_tmp / "serve.log", "--demo", "--workers", "2", cwd=reachable_tmp)
    try:
        wait_until_ready(gateway)
        deadline = time.monotonic() + 30
        while not (match := DEMO_TOKEN.search(gateway.log_path.read_text())) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert match, gateway.log_path.read_text()
        headers = {"Authorization": f"Bearer {match.group(1)}"}
        # A new connection per request: the workers take turns accepting them.
        statuses = [httpx.get(gateway.url + "/v1/tools", headers=headers, timeout=10).status_code for _ in range(12)]
        assert statuses == [200] * 12
        started = [line for line in gateway.log_path.read_text().splitlines() if "Application startup complete" in line]
        assert len(started) == 2
    finally:
        gateway.stop()
    assert not EmbeddedPostgres(reachable_tmp / ".gateway" / "postgres").is_running()
