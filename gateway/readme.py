"""Keep the README's generated tables (settings, error codes, identity-like argument names) in step with the code.

    python -m gateway.readme          # rewrite README.md in place
A test fails when the README and the code disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gateway import errors, settings
from gateway.tools.strict_schema import IDENTITY_FIELDS


def identity_fields() -> str:
    return ", ".join(f"`{name}`" for name in IDENTITY_FIELDS) + "."


SECTIONS = {
    "settings": settings.markdown_table,
    "errors": errors.markdown_table,
    "identity-fields": identity_fields,
}


def render(text: str) -> str:
    for name, table in SECTIONS.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- {name}:start --> ... <!-- {name}:end --> section")
        text = pattern.sub(lambda m, t=table: m.group(1) + t() + "\n" + m.group(2), text)
    return text


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("README.md")
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
