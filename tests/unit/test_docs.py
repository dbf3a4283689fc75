"""The README and the reference in docs/ say what the code does."""

import re
from pathlib import Path

from gateway.docs import PAGES, stale_pages

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/gateway serve --demo"


def test_generated_sections_match_the_code():
    assert stale_pages(ROOT) == [], "docs are stale: run `python -m gateway.docs`"


def test_every_generated_section_is_on_a_page_of_the_reference():
    assert {"settings", "errors", "identity-fields"} <= {name for names in PAGES.values() for name in names}
    for page in PAGES:
        assert (ROOT / page).is_file() and page.startswith("docs/")


def test_readme_states_both_quick_start_commands_verbatim():
    text = README.read_text()
    assert DEMO_COMMAND in text
    assert TEST_COMMAND in text


def test_ci_runs_the_readme_test_command():
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


def test_every_route_is_in_the_api_table():
    from gateway.app import create_app
    from tests.support.app import make_settings

    app = create_app(make_settings("postgresql+asyncpg://gateway@127.0.0.1:1/never-opened"))
    documented = set()
    for line in (DOCS / "api.md").read_text().splitlines():
        if line.startswith("| `") and "/" in line:
            cell = line.split("|")[1]
            for path in re.findall(r"`(?:[A-Z/]+ )?(/[^` ?]*)", cell):
                documented.add(re.sub(r"\{[^}]+\}", "{}", path.rstrip("/")))
    served = {
        re.sub(r"\{[^}]+\}", "{}", route.path.rstrip("/") or "/")
        for route in app.routes
        if not route.path.startswith("/schema")
    }
    assert served - documented == set()
