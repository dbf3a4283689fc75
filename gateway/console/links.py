"""Where the console is, for whoever prints a link to it (the demo, an operator's script)."""

from __future__ import annotations

CONSOLE_PATH = "/console/"


def console_url(base_url: str) -> str:
    """The console's sign-in page under the gateway's base URL (``http://127.0.0.1:8000``).
    The link carries no token: the user signs in on the page (a token never goes in a URL)."""
    return base_url.rstrip("/") + CONSOLE_PATH + "sign-in"
