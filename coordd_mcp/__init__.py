"""coordd-mcp: an MCP server (stdio) that lets LLM agents use coordd.

The server is a plain coordd client: it connects to coordd's Unix socket with the uid of
whoever launched it, so coordd's SO_PEERCRED admin check applies unchanged (an agent
launched by a uid outside the admin set cannot enqueue or cancel). Tools and their JSON
schemas are in `coordd_mcp.tools`; the stdio wiring is in `coordd_mcp.__main__`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of `coordd-mcp` (coordd_mcp.__main__.main); without the `mcp` extra, a
    one-line hint and exit 2 instead of a traceback."""
    try:
        from coordd_mcp.__main__ import main as run
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "mcp":
            raise
        print("coordd-mcp: the MCP server needs the `mcp` extra: pip install 'coordd[mcp]' "
              "(in a checkout: .venv/bin/pip install -e '.[mcp]')", file=sys.stderr)
        return 2
    return run(argv)
