"""`coordd [--db PATH | --store DSN] [--socket PATH] [--config FILE] [--log-json]`: run the daemon."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import msgspec

from coordd import config as config_mod
from coordd import paths
from coordd.errors import ConfigError
from coordd.process_start import ignore_sighup_until_handled, setup_logging

logger = logging.getLogger("coordd")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (also read by docgen for the configuration reference)."""
    p = argparse.ArgumentParser(prog="coordd", description="Local coordinator for AI jobs.")
    p.add_argument("--db", help="SQLite file (env COORDD_DB; default "
                                "$XDG_STATE_HOME/coordd/coordd.db: ~/.local/state/coordd/coordd.db)")
    p.add_argument("--socket", help="Unix socket (env COORDD_SOCKET; default "
                                    "$XDG_RUNTIME_DIR/coordd/coordd.sock, or "
                                    "$XDG_STATE_HOME/coordd/coordd.sock when XDG_RUNTIME_DIR "
                                    "is unset)")
    p.add_argument("--store", metavar="DSN",
                   help="postgresql://... : serve the core over PostgreSQL (config `store`; "
                        "a second coordd with the same DSN is its standby)")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--log-json", action="store_true", help="log JSON lines")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `coordd` command. Exit codes: 0 clean stop, 1 cannot start, 2 usage."""
    ignore_sighup_until_handled()
    from coordd.daemon.server import Daemon, StartupError  # after the line above: ~0.3 s of imports
    import uvloop
    args = parse_args(argv)
    try:
        cfg = config_mod.load(args.config, store=args.store)
    except ConfigError as exc:
        print(f"coordd: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_json or cfg.log_json)
    db = args.db or cfg.db or str(paths.default_db_path())
    sock = args.socket or cfg.socket or str(paths.default_socket_path())
    for path, given in ((db, args.db or cfg.db or cfg.store), (sock, args.socket or cfg.socket)):
        if not given:  # a default location: create our own folder; a given one must exist
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    cfg = msgspec.structs.replace(cfg, db=db, socket=sock)
    try:
        uvloop.run(Daemon(cfg, config_path=args.config).run())  # over SQLite or PostgreSQL
    except StartupError as exc:  # one line on stderr (the journal under systemd), no log twin
        print(f"coordd: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
