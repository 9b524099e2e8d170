"""SIGHUP: what coordd reloads while it runs, and what it says about the rest.

systemd's `systemctl reload` (the unit's ExecReload), logrotate scripts and operators send
SIGHUP routinely; it must never end coordd. What applies now: the TCP listener's TLS
certificates and deny-lists (coordd.tcp). Every other setting is read at start: the
config file is re-read only to name the settings that changed in it and need a restart,
so an operator who edited the file and reloaded is not misled. One log line per SIGHUP
says what was done; a file that no longer loads is logged and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgspec

from coordd import config as config_mod
from coordd.config import Config
from coordd.errors import ConfigError

logger = logging.getLogger(__name__)

LIVE_WHEN_TCP = frozenset({"tls_deny_workers", "tls_deny_serials"})
"""Settings a SIGHUP applies at once when the TCP listener serves (coordd.tcp.reload)."""
FROM_ARGS = frozenset({"db", "socket"})
"""Settings the command line may give instead of the file: never compared."""


def changed_settings(running: Config, fresh: Config, live: Iterable[str] = ()) -> list[str]:
    """The names of the settings whose value in `fresh` (the file as it reads now) differs
    from `running`, less `live` ones (applied by the reload) and FROM_ARGS; sorted."""
    skip = FROM_ARGS | set(live)
    old, new = msgspec.structs.asdict(running), msgspec.structs.asdict(fresh)
    return sorted(k for k in new if k not in skip and old.get(k) != new[k])


def reload(running: Config, config_path: str | None, listeners: Iterable[Any]) -> str:
    """Do what a SIGHUP does (see the module doc) and return the line it logged.

    `listeners`: the TCP listeners serving (coordd.tcp.TcpListener; none without
    `listen_tcp`), each reloaded with `config_path`. Never raises for a bad file.
    """
    listeners = [t for t in listeners if t is not None]
    for tcp in listeners:
        tcp.reload(config_path)
    done = ("reloaded the TLS certificates and deny-lists" if listeners
            else "nothing to reload (no TCP listener)")
    pending: list[str] = []
    if config_path:
        try:
            fresh = config_mod.load(config_path)
        except ConfigError as exc:
            logger.error("SIGHUP: %s; %s, the running settings are unchanged", exc, done,
                         extra={"action": "reload_failed"})
            return f"SIGHUP: {exc}"
        pending = changed_settings(running, fresh, LIVE_WHEN_TCP if listeners else ())
    line = f"SIGHUP: {done}"
    if pending:
        line += (f"; changed in {config_path}, applied at the next restart: "
                 + ", ".join(pending))
        logger.warning(line, extra={"action": "reload", "restart_needed": pending})
    else:
        logger.info(line, extra={"action": "reload"})
    return line
