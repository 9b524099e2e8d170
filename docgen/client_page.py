"""docs/reference/client.md: the Python client, rendered by mkdocstrings from
coordd/client.py's docstrings (`::: coordd.client`)."""

from __future__ import annotations

from docgen import md


def render() -> str:
    """The whole page (mkdocstrings fills in the API at build time)."""
    return (
        md.header("Python client", "coordd/client.py (through mkdocstrings)",
                  "`coordd.client` is how a program talks to coordd: `Client` (asyncio) and "
                  "`SyncClient` (blocking, for scripts). Each method is one RPC of the "
                  "[wire protocol](protocol.md) and raises the server's error as a "
                  "`coordd.errors.CoordError` subclass carrying its `code`.")
        + "```python\nfrom coordd.client import SyncClient\n\n"
        "with SyncClient() as c:  # $COORDD_SOCKET, else the per-user socket\n"
        "    job = c.enqueue(kind=\"keywords\", required_role=\"cpu\", priority=1,\n"
        "                    payload={\"module\": \"json\", \"top\": 3})\n"
        "    view = c.wait_for(job.job_id, timeout=60)\n"
        "    print(view.status, view.result)\n```\n\n"
        "::: coordd.client\n"
        "    options:\n"
        "      show_root_heading: false\n"
        "      show_source: false\n"
        "      inherited_members: true\n"
        "      members_order: source\n"
        "      filters: [\"!^_\", \"!^message$\"]\n\n"
        "::: coordd.errors\n"
        "    options:\n"
        "      heading_level: 2\n"
        "      show_root_heading: true\n"
        "      show_source: false\n"
        "      members_order: source\n")
