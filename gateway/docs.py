"""Keep the generated parts of the reference in ``docs/`` in step with the code: the settings
table, the error-code table and the identity-like argument names.

    python -m gateway.docs            # rewrite them in place, from the repository root
    python -m gateway.docs --check    # exit 1, naming the stale pages, when one disagrees

A test fails when a page and the code disagree.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from gateway import errors, settings
from gateway.tools.strict_schema import IDENTITY_FIELDS


def identity_fields() -> str:
    return ", ".join(f"`{name}`" for name in IDENTITY_FIELDS) + "."


SECTIONS: dict[str, Callable[[], str]] = {
    "settings": settings.markdown_table,
    "errors": errors.markdown_table,
    "identity-fields": identity_fields,
}

PAGES: dict[str, tuple[str, ...]] = {
    "docs/configuration.md": ("settings",),
    "docs/errors.md": ("errors",),
    "docs/http-tools.md": ("identity-fields",),
}
"""Each generated section lives on one page, between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``."""


def render(text: str, sections: tuple[str, ...] = tuple(SECTIONS)) -> str:
    for name in sections:
        table = SECTIONS[name]
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"no <!-- {name}:start --> ... <!-- {name}:end --> section")
        text = pattern.sub(lambda m, t=table: m.group(1) + t() + "\n" + m.group(2), text)
    return text


def render_page(root: Path, page: str) -> tuple[str, str]:
    """The page as it is and as the code says it should be."""
    text = (root / page).read_text()
    try:
        return text, render(text, PAGES[page])
    except ValueError as error:
        raise ValueError(f"{page}: {error}") from None


def stale_pages(root: Path) -> list[str]:
    stale = []
    for page in PAGES:
        current, wanted = render_page(root, page)
        if current != wanted:
            stale.append(page)
    return stale


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    root = Path(next((arg for arg in args if arg != "--check"), "."))
    missing = [page for page in PAGES if not (root / page).is_file()]
    if missing:
        print(f"no {missing[0]} under {root.resolve()}: run from the repository root, or name it", file=sys.stderr)
        return 2
    if check:
        stale = stale_pages(root)
        for page in stale:
            print(f"{page} is stale: run `python -m gateway.docs`", file=sys.stderr)
        return 1 if stale else 0
    for page in PAGES:
        current, wanted = render_page(root, page)
        if wanted != current:
            (root / page).write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
