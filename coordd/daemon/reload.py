"""SIGHUP: what coordd reloads while it runs, and what it says about the rest.

systemd's `systemctl reload` (the unit's ExecReload), logrotate scripts and operators send
SIGHUP routinely; it must never end coordd. What applies now: the TCP listener's TLS
certificates and deny-lists (coordd.daemon.tcp). Every other setting is read at start: the
config file is loaded again by coordd.config (the loader and checks of the start) and
otherwise only names the settings that changed in it and need a restart, so an operator
who edited the file and reloaded is not misled. One log line per SIGHUP says what was
done; a file that no longer loads is one error line and changes nothing.
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
"""Settings a SIGHUP applies at once when the TCP listener serves (coordd.daemon.tcp.reload)."""
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

    The file is loaded by `coordd.config.load`, as at start: one that does not load (not
    TOML, a wrong type, a bad value) changes no setting, not even the deny-lists, and is
    one ERROR line; the certificate files are reloaded either way. `listeners`: the TCP
    listeners serving (coordd.daemon.tcp.TcpListener; none without `listen_tcp`), each reloaded
    with the loaded Config (None when it did not load). Never raises for a bad file.
    """
    listeners = [t for t in listeners if t is not None]
    fresh: Config | None = None
    failed: ConfigError | None = None
    if config_path:
        try:
            fresh = config_mod.load(config_path)
        except ConfigError as exc:
            failed = exc
    for tcp in listeners:
        tcp.reload(fresh)
    if failed is not None:
        done = ("reloaded the TLS certificates; the deny-lists and every other setting are "
                "unchanged" if listeners else "the running settings are unchanged")
        logger.error("SIGHUP: %s; %s", failed, done, extra={"action": "reload_failed"})
        return f"SIGHUP: {failed}"
    done = ("reloaded the TLS certificates and deny-lists" if listeners
            else "nothing to reload (no TCP listener)")
    pending = [] if fresh is None else changed_settings(
        running, fresh, LIVE_WHEN_TCP if listeners else ())
    line = f"SIGHUP: {done}"
    if pending:
        line += (f"; changed in {config_path}, applied at the next restart: "
                 + ", ".join(pending))
        logger.warning(line, extra={"action": "reload", "restart_needed": pending})
    else:
        logger.info(line, extra={"action": "reload"})
    return line
