"""Where a PostgreSQL DSN points, said for messages without its secrets."""

from __future__ import annotations

import urllib.parse


def store_address(dsn: str) -> str:
    """Where a libpq URI points, for messages: `host H, port P, database D` (the query's
    `host=`/`port=`/`dbname=` win, as in libpq; libpq's defaults where absent). Never the
    user or password."""
    try:
        url = urllib.parse.urlsplit(dsn)
        query = urllib.parse.parse_qs(url.query)
        host = query.get("host", [url.hostname or ""])[0] or "the default socket folder"
        port = query.get("port", [str(url.port or "")])[0] or "5432"
    except ValueError:
        return "an unreadable DSN"
    db = query.get("dbname", [url.path.lstrip("/")])[0] or "the user's name"
    return f"host {host}, port {port}, database {db}"
