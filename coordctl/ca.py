"""`coordctl ca init DIR` and `coordctl ca issue (--worker ID | --admin NAME | --server NAME
[--ip ADDR] [--dns NAME]) DIR`: the fleet's private CA (coordd.net.pki), files 0600; these run
here, on files, and never talk to coordd. `coordctl token create --worker ID [--ttl 1h]`
asks coordd for a one-time enrolment token (coordd.service.enrol)."""

from __future__ import annotations

import argparse
import shlex
import socket
from collections.abc import Callable
from typing import Any

from coordctl.commands import Outcome
from coordd.net import pki
from coordd.rules.times import fmt_time
from coordd.net.tls import split_host_port

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
    tok = cmd("token", "one-time enrolment tokens (coord-worker enroll)")
    tsub = tok.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = tsub.add_parser("create", help="a token with which worker ID gets its certificate")
    create.add_argument("--worker", required=True, metavar="ID")
    create.add_argument("--ttl", type=duration, default=3600.0, metavar="DURATION",
                        help="how long the token is good: 90s, 30m, 1h, 2d (default 1h)")


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """An argparse type: seconds, or a number with s/m/h/d, > 0."""
    unit = _UNITS.get(text[-1:], None)
    try:
        value = float(text[:-1] if unit else text) * (unit or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 30m, 1h)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def enroll_server(listen_enroll: str) -> str:
    """The HOST:PORT a worker enrols at, from coordd's `listen_enroll` (coordctl runs on
    coordd's host: a wildcard address becomes this host's name); "HOST:PORT" if unknown."""
    try:
        host, port = split_host_port(listen_enroll)
    except ValueError:
        return "HOST:PORT"
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def token(client: Any, args: argparse.Namespace) -> Outcome:
    """`token create`: print the token once, with the CA pin and the `coord-worker enroll`
    command a worker enrols with (--json: the raw reply, `expires_at` in Unix seconds)."""
    from coordd.wire.enrol import TokenCreated
    got = client.call("token_create", {"worker_id": args.worker, "ttl_s": args.ttl}, TokenCreated)
    command = shlex.join(["coord-worker", "enroll", "--server", enroll_server(got.enroll_address),
                          "--token", got.token, "--ca-sha256", got.ca_sha256])
    return Outcome(got, f"{got.token}\n(worker {got.worker_id}; single use; expires "
                        f"{fmt_time(got.expires_at)})\nenrol on the worker's host with:\n"
                        f"  {command}")


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


COMMANDS = {"ca": ca, "token": token}
