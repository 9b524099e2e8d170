"""`coordctl ca init DIR` and `coordctl ca issue (--worker ID | --admin NAME | --server NAME
[--ip ADDR] [--dns NAME]) DIR`: the fleet's private CA (coordd.pki), files 0600. These run
here, on files; they never talk to coordd."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from coordctl.commands import Outcome
from coordd import pki

AddCommand = Callable[[str, str], argparse.ArgumentParser]


def add_parsers(cmd: AddCommand) -> None:
    """Register `ca init` and `ca issue` with coordctl's parser."""
    ca = cmd("ca", "the fleet's private CA for coordd's TCP listener (mutual TLS)")
    sub = ca.add_subparsers(dest="ca_command", required=True, metavar="ACTION")
    init = sub.add_parser("init", help="make the CA key and certificate in DIR (ca.key, ca.pem)")
    init.add_argument("dir", metavar="DIR")
    init.add_argument("--name", default="coordd fleet CA", help="the CA's common name")
    issue = sub.add_parser(
        "issue", help="issue a certificate and key from the CA in DIR (written beside it)")
    who = issue.add_mutually_exclusive_group(required=True)
    who.add_argument("--worker", metavar="ID", help="a worker (URI SAN coordd-worker://ID)")
    who.add_argument("--admin", metavar="NAME",
                     help="an admin client over TCP (URI SAN coordd-admin://NAME)")
    who.add_argument("--server", metavar="NAME",
                     help="coordd itself (DNS:coordd, the name workers pin, plus NAME)")
    issue.add_argument("--ip", action="append", default=[], metavar="ADDR",
                       help="with --server: an IP address SAN (repeatable)")
    issue.add_argument("--dns", action="append", default=[], metavar="NAME",
                       help="with --server: another DNS SAN (repeatable)")
    issue.add_argument("--days", type=float, default=pki.LEAF_DAYS,
                       help=f"validity in days (default {pki.LEAF_DAYS})")
    issue.add_argument("dir", metavar="DIR")


def ca(_client: Any, args: argparse.Namespace) -> Outcome:
    """Run `ca init` / `ca issue`; a refusal (a file in the way, no CA) is `ca_refused`."""
    try:
        if args.ca_command == "init":
            made = pki.init_ca(args.dir, args.name)
            fp = pki.fingerprint(made.cert.read_bytes())
            data = {"cert": str(made.cert), "key": str(made.key), "sha256": fp}
            return Outcome(data, f"CA made: {made.cert} (key {made.key}, 0600)\n"
                                 f"sha256 {fp}  (give it to `coord-worker enroll --ca-sha256`)")
        if (args.ip or args.dns) and args.server is None:
            return Outcome(None, "", failure=("usage", "--ip and --dns go with --server"))
        if not 0 < args.days <= 3650:
            return Outcome(None, "", failure=("usage", "--days must be > 0 and <= 3650"))
        made = pki.issue(args.dir, worker=args.worker, admin=args.admin, server=args.server,
                         ips=args.ip, dns=args.dns, days=args.days)
    except pki.PkiError as exc:
        return Outcome(None, "", failure=("ca_refused", str(exc)))
    data = {"cert": str(made.cert), "key": str(made.key), "serial": made.serial}
    return Outcome(data, f"issued {made.cert} (key {made.key}, 0600; serial {made.serial})")


COMMANDS = {"ca": ca}
