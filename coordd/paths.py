"""Where coordd's programs look when no flag or setting says: the state folder, the
socket and the database (from the XDG folders, $COORDD_SOCKET and $COORDD_DB), the
artifact store beside a database, and the name a client tool acts as in the message hub
($COORD_AGENT). Used by coordd, coordctl, the MCP server and the client library alike.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path


def default_state_dir() -> Path:
    """Return `$XDG_STATE_HOME/coordd` (default ~/.local/state/coordd)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "coordd"


def default_socket_path() -> Path:
    """Return `$COORDD_SOCKET`, else `$XDG_RUNTIME_DIR/coordd/coordd.sock`, else one in the state dir."""
    env = os.environ.get("COORDD_SOCKET")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "coordd" / "coordd.sock"
    return default_state_dir() / "coordd.sock"


def default_agent_name(tool: str) -> str:
    """The agent name a client tool acts as in the message hub: `$COORD_AGENT`, else
    `<tool>:<login>` (`<tool>:uid<N>` when the login cannot be looked up)."""
    env = os.environ.get("COORD_AGENT")
    if env:
        return env
    try:
        return f"{tool}:{getpass.getuser()}"
    except (KeyError, OSError):
        return f"{tool}:uid{os.getuid()}"


def artifact_dir_for(db_path: str | os.PathLike[str]) -> str:
    """The content-addressed artifact store beside a database: `<db folder>/artifacts`,
    the folder of the file itself (symlinks resolved), whatever name reached it."""
    return os.path.join(os.path.dirname(os.path.realpath(db_path)), "artifacts")


def default_db_path() -> Path:
    """Return `$COORDD_DB`, else `<state dir>/coordd.db`."""
    env = os.environ.get("COORDD_DB")
    return Path(env) if env else default_state_dir() / "coordd.db"
