"""A database that cannot be reached ends every CLI command with one clear line, not a traceback."""

from __future__ import annotations

import socket

import pytest

from tests.support.loopback import free_port
from tests.support.processes import run_cli

COMMANDS = [
    ["migrate"],
    ["serve", "--port", "1"],  # migrations run first: the database is the first thing to fail
    ["seed-demo"],
    ["tenants", "list"],
    ["tenants", "create", "initech"],
    ["audit", "seal"],
    ["audit", "verify", "--tenant", "acme"],
    ["token", "--tenant", "acme", "--user", "alice"],  # roles from the directory
]


@pytest.fixture(scope="module")
def closed_port_url() -> str:
    """A PostgreSQL URL whose port nobody listens on; the password must never be printed."""
    return f"postgresql+asyncpg://gateway:hunter2-secret@127.0.0.1:{free_port()}/gateway"


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_an_unreachable_database_is_one_line_and_a_failing_exit(closed_port_url: str, command: list[str]) -> None:
    result = run_cli(closed_port_url, *command)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("gateway: the database at postgresql+asyncpg://gateway:***@127.0.0.1:"), lines[0]
    assert "failed: " in lines[0] and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.postgres
def test_serve_on_a_port_in_use_is_one_line_and_a_failing_exit(fleet_database: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_cli(fleet_database, "serve", "--no-migrate", "--port", str(port))
    assert result.returncode != 0
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "address already in use" in lines[0] and "Traceback" not in lines[0]
