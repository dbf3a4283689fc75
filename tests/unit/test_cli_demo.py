"""What the demo start-up writes and prints: its secret private from the first byte, its
banner without the database's password."""

from __future__ import annotations

import os
import stat

import pytest

from gateway.cli import demo_secret, print_demo_banner
from gateway.settings import Settings


@pytest.fixture
def lax_umask():
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_demo_secret_is_created_readable_by_its_owner_only(tmp_path, lax_umask):
    path = tmp_path / ".gateway-demo-secret"
    secret = demo_secret(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(secret) >= 32 and demo_secret(path) == secret


def test_a_demo_secret_left_readable_by_others_is_made_private_and_kept(tmp_path, lax_umask):
    path = tmp_path / ".gateway-demo-secret"
    path.write_text("an-existing-secret-kept-across-restarts\n")
    path.chmod(0o644)
    assert demo_secret(path) == "an-existing-secret-kept-across-restarts"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_demo_banner_names_the_database_without_its_password(capsys):
    settings = Settings.from_flat(
        database_url="postgresql+asyncpg://gateway:S3cretPassw0rd@db.internal:5432/gateway",
        jwt_secret="s" * 48,
    )
    print_demo_banner(settings, "127.0.0.1", 8000)
    printed = capsys.readouterr().out
    assert "S3cretPassw0rd" not in printed
    assert "gateway:***@db.internal:5432/gateway" in printed
