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
