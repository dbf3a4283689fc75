"""The README and the reference in docs/ say what the code does, and every link in them leads somewhere."""

import re
from pathlib import Path

from gateway.docs import PAGES, main, stale_pages

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/gateway serve --demo"
README_MAX_BYTES = 12 * 1024


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


FENCED_BLOCK = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)


def without_code(text: str) -> str:
    """The text outside fenced blocks and inline code spans: what a reader sees as prose and headings."""
    return re.sub(r"(`+).+?\1", "", FENCED_BLOCK.sub("", text))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", FENCED_BLOCK.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", without_code(page.read_text()))
    return [target for target in targets if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def test_generated_sections_match_the_code():
    assert stale_pages(ROOT) == [], "docs are stale: run `python -m gateway.docs`"


def test_the_generator_reports_a_stale_page_and_rewrites_only_its_tables(tmp_path: Path):
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((ROOT / page).read_text())
    page = tmp_path / "docs" / "errors.md"
    fresh = page.read_text()
    page.write_text(fresh.replace("| `UNAUTHENTICATED` | 401 |", "| `UNAUTHENTICATED` | 400 |"))
    assert main(["--check", str(tmp_path)]) == 1
    assert main([str(tmp_path)]) == 0
    assert page.read_text() == fresh
    assert main(["--check", str(tmp_path)]) == 0


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


def test_readme_stays_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; the reference belongs in docs/"


def test_every_relative_link_leads_to_an_existing_file_and_heading():
    broken = []
    for page in pages():
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_page_of_the_reference_is_linked_from_the_readme():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in relative_links(README)}
    assert [page.name for page in DOCS.glob("*.md") if page.resolve() not in linked] == []


def test_the_anchor_rule_matches_github():
    page = DOCS / "administration.md"
    assert {"tenant-administration", "audit-api", "tamper-evidence-the-hash-chain"} <= anchors(page)
    assert "gateway-chat" in anchors(DOCS / "agent-loop.md")


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
