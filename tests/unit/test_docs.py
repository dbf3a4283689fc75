"""The README's generated tables say what the code does."""

from pathlib import Path

from gateway.readme import render

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_error_and_settings_tables_match_the_code():
    text = README.read_text()
    assert render(text) == text, "README is stale: run `python -m gateway.readme`"


def test_readme_states_both_quick_start_commands_verbatim():
    text = README.read_text()
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/gateway serve --demo" in text
    assert "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest" in text


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest" in ci


def test_every_route_is_in_the_readme_api_table():
    import re

    from gateway.app import create_app
    from tests.support.app import make_settings

    app = create_app(make_settings("postgresql+asyncpg://gateway@127.0.0.1:1/never-opened"))
    documented = set()
    for line in README.read_text().splitlines():
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
