"""`coord-worker enroll --server HOST:PORT --token T --ca-sha256 FP [--out DIR]`: get this
worker's mTLS certificate from coordd's enrolment listener (coordd.enrol).

The key is made here and never leaves the host. The token is sent only over a connection
that verified coordd against the CA whose SHA-256 was pinned on the command line: first
`ca_bundle` over an unverified connection (nothing secret sent), the fingerprint checked,
then `enroll` over a connection verifying coordd's certificate (name `coordd`) by that CA.
Writes DIR/worker.key, DIR/worker.pem and DIR/ca.pem (0600, never overwriting).
Exit codes: 0 enrolled, 1 refused (fingerprint, token), 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
from pathlib import Path

import uvloop

from coordd import errors, pki
from coordd.client import Client
from coordd.protocol_enrol import CaBundle, Enrolled
from coordd.transport import Connector


class EnrolRefused(Exception):
    """Enrolment did not happen; the message says why."""


def _unverified() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only to fetch the public CA, checked against the pin
    return ctx


def _pinned(ca_pem: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


async def enroll(server: str, token: str, ca_sha256: str, out: Path,
                 timeout: float = 10.0) -> Enrolled:
    """Enrol; write the key, certificate and CA under `out`. Raises: EnrolRefused."""
    pin = ca_sha256.replace(":", "").lower()
    url = f"tls://{server}"
    try:
        async with Client(connector=Connector(url, context=_unverified()), timeout=timeout) as c:
            bundle = await c.call("ca_bundle", {}, CaBundle)
        got = pki.fingerprint(bundle.ca_pem.encode())
        if got != pin:
            raise EnrolRefused(f"the CA coordd at {server} presents has SHA-256 {got}, not the "
                               f"pinned {pin}: not sending the token")
        key = pki.new_key()
        csr = pki.make_csr(key, "enrolling")
        async with Client(connector=Connector(url, context=_pinned(bundle.ca_pem)),
                          timeout=timeout) as c:
            done = await c.call("enroll", {"token": token, "csr_pem": csr.decode()}, Enrolled)
    except errors.CoordError as exc:
        raise EnrolRefused(f"{exc.code}: {exc.message}") from exc
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        pki.write_private(out / "worker.key", pki.key_pem(key))
        pki.write_private(out / "worker.pem", done.cert_pem.encode())
        pki.write_private(out / "ca.pem", done.ca_pem.encode())
    except (pki.PkiError, OSError) as exc:
        raise EnrolRefused(f"enrolled as {done.worker_id}, but cannot write the files: {exc}") \
            from exc
    return done


def default_out() -> str:
    """`$STATE_DIRECTORY/tls` under systemd, else ~/.local/state/coordd/tls."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return os.path.join(state, "tls") if state else os.path.expanduser("~/.local/state/coordd/tls")


def main(argv: list[str]) -> int:
    """Entry point of `coord-worker enroll`."""
    p = argparse.ArgumentParser(prog="coord-worker enroll",
                                description="Get this worker's certificate from coordd.")
    p.add_argument("--server", required=True, metavar="HOST:PORT",
                   help="coordd's enrolment listener (listen_enroll)")
    p.add_argument("--token", required=True, help="from `coordctl token create --worker ID`")
    p.add_argument("--ca-sha256", required=True, metavar="FP",
                   help="the fleet CA's SHA-256 (printed by `coordctl ca init` / `token create`)")
    p.add_argument("--out", default=default_out(), metavar="DIR",
                   help="where worker.key, worker.pem, ca.pem go (default: %(default)s)")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        done = uvloop.run(enroll(args.server, args.token, args.ca_sha256, out))
    except EnrolRefused as exc:
        print(f"coord-worker enroll: {exc}", file=sys.stderr)
        return 1
    host = args.server.rpartition(":")[0]
    print(f"enrolled as worker {done.worker_id} (serial {done.serial}); run:\n"
          f"  coord-worker --worker-id {done.worker_id} --roles ... --connect tls://{host}:PORT "
          f"--cert {out / 'worker.pem'} --key {out / 'worker.key'} --ca {out / 'ca.pem'}")
    return 0
