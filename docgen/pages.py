"""The generated pages: path (relative to the repository root) -> renderer."""

from __future__ import annotations

from collections.abc import Callable

from docgen import cli_page, client_page, config_page, metrics_page, protocol_page
from docgen.md import ROOT

__all__ = ["PAGES", "REGENERATE", "ROOT", "render_all"]
REGENERATE = "python -m docgen"
"""The command that rewrites them (run from the repository root)."""

PAGES: dict[str, Callable[[], str]] = {
    "docs/reference/coordctl.md": cli_page.render,
    "docs/reference/configuration.md": config_page.render,
    "docs/reference/protocol.md": protocol_page.render,
    "docs/reference/metrics.md": metrics_page.render,
    "docs/reference/client.md": client_page.render,
}


def render_all() -> dict[str, str]:
    """Every page's text, rendered now from the imported code."""
    return {rel: render() for rel, render in PAGES.items()}
