"""Browser tests: Debian's Chromium (``/usr/bin/chromium``) driven by Playwright against a
real ``gateway serve`` process on a seeded PostgreSQL database.

Playwright's sync API runs in sync tests (no event loop is running there under
pytest-asyncio). Chromium is required: without it the tests fail, they never skip. On a
failure, each open page is saved as a screenshot under ``test-output/browser/``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests.conftest import _admin
from tests.support.app import seeded
from tests.support.postgres import PostgresServer
from tests.support.processes import ROOT, GatewayProcess, gateway_env, start_gateway, wait_until_ready

CHROMIUM = os.environ.get("GATEWAY_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
OUTPUT = ROOT / "test-output" / "browser"
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def browser(pg_template: str) -> Iterator[Browser]:
    """Made after the session's database fixtures, which run event loops of their own. One per
    module: Playwright's sync API keeps an event loop running in this thread until it stops,
    and every later test that runs a loop of its own (asyncio.run) would fail beside it."""
    if shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is required for the browser tests and was not found at {CHROMIUM}")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def off_the_loop(function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function`` (which runs its own event loop) in another thread: Playwright's sync
    API keeps one running in this thread while the browser is open."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(function, *args).result(timeout=120)


def seeded_database(postgres: PostgresServer, template: str) -> Iterator[str]:
    name = f"gw_b_{uuid.uuid4().hex[:12]}"
    off_the_loop(_admin, postgres, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    url = postgres.sqlalchemy_url(name)
    try:
        off_the_loop(asyncio.run, seeded(url))
        yield url
    finally:
        off_the_loop(_admin, postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def serve(database_url: str, **settings: Any) -> Iterator[GatewayProcess]:
    env = gateway_env(database_url, **{"log_level": "WARNING", "rate_limit_tenant_rps": 0, "rate_limit_user_rps": 0,
                                       **settings})
    with tempfile.TemporaryDirectory(prefix="gateway-browser-") as logs:
        gateway = start_gateway(env, Path(logs) / "gateway.log")
        try:
            wait_until_ready(gateway)
            yield gateway
        finally:
            gateway.stop()


@pytest.fixture(scope="module")
def browser_db(postgres: PostgresServer, pg_template: str) -> Iterator[str]:
    yield from seeded_database(postgres, pg_template)


@pytest.fixture(scope="module")
def gateway(browser_db: str) -> Iterator[GatewayProcess]:
    """One `gateway serve` for the module's tests (each works on approvals of its own)."""
    yield from serve(browser_db)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[FAILED] = report.failed


FAILED = pytest.StashKey[bool]()


@pytest.fixture
def context(browser: Browser, request: pytest.FixtureRequest) -> Iterator[BrowserContext]:
    """A fresh browser profile (no cookies); its pages are saved as screenshots if the test fails."""
    ctx = browser.new_context(viewport={"width": 1000, "height": 800})
    ctx.set_default_timeout(TIMEOUT_MS)
    try:
        yield ctx
    finally:
        if request.node.stash.get(FAILED, False):
            OUTPUT.mkdir(parents=True, exist_ok=True)
            for index, open_page in enumerate(ctx.pages):
                try:
                    open_page.screenshot(path=str(OUTPUT / f"{request.node.name}-{index}.png"), full_page=True)
                except Exception:  # noqa: BLE001 - a screenshot is a courtesy; the failure is reported anyway
                    pass
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()
