"""`coord-worker enroll --server HOST:PORT --token T --ca-sha256 FP [--out DIR]`: get this
worker's mTLS certificate from coordd's enrolment listener (coordd.service.enrol).

The key is made here and never leaves the host. The token is sent only over a connection
that verified coordd against the CA whose SHA-256 was pinned on the command line: first
`ca_bundle` over an unverified connection (nothing secret sent), the fingerprint checked,
then `enroll` over a connection verifying coordd's certificate (name `coordd`) by that CA.
Writes DIR/worker-ID.key, DIR/worker-ID.pem (ID: the token's worker id) and DIR/ca.pem
(0600, never overwriting; an identical ca.pem is kept): the names `coordctl ca issue
--worker ID` writes and systemd/coord-worker-fleet.conf loads. Prints the `coord-worker`
command that runs with them. Exit codes: 0 enrolled, 1 refused (fingerprint, token), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import shlex
import ssl
import sys
from pathlib import Path

import uvloop

from coordd import errors
from coordd.net import pki
from coordd.paths import default_state_dir
from coordd.client import Client
from coordd.wire.enrol import CaBundle, Enrolled
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
        cert, key_file, ca = files(out, done.worker_id)
        pki.write_private(key_file, pki.key_pem(key))
        pki.write_private(cert, done.cert_pem.encode())
        if not (ca.exists() and ca.read_bytes() == done.ca_pem.encode()):
            pki.write_private(ca, done.ca_pem.encode())
    except (pki.PkiError, OSError) as exc:
        raise EnrolRefused(f"enrolled as {done.worker_id}, but cannot write the files: {exc}") \
            from exc
    return done


def files(out: Path, worker_id: str) -> tuple[Path, Path, Path]:
    """(certificate, key, CA) of `worker_id` in `out`: worker-ID.pem, worker-ID.key, ca.pem."""
    return out / f"worker-{worker_id}.pem", out / f"worker-{worker_id}.key", out / pki.CA_CERT


SYSTEM_TLS_DIR = "/etc/coordd/tls"
"""Where systemd/coord-worker-fleet.conf loads a worker's files from."""


def default_out() -> str:
    """`$STATE_DIRECTORY/tls` under systemd, SYSTEM_TLS_DIR as root, else `tls` in coordd's
    state folder (`$XDG_STATE_HOME/coordd/tls`, ~/.local/state/coordd/tls by default)."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return os.path.join(state, "tls")
    return SYSTEM_TLS_DIR if os.geteuid() == 0 else str(default_state_dir() / "tls")


def run_command(done: Enrolled, server: str, out: Path, roles: str) -> str:
    """The `coord-worker` command line that runs as the enrolled worker (shell-quoted)."""
    host = server.rpartition(":")[0]
    cert, key, ca = files(out.absolute(), done.worker_id)
    port = str(done.tcp_port) if done.tcp_port else "PORT"
    return shlex.join(["coord-worker", "--worker-id", done.worker_id, "--roles", roles,
                       "--connect", f"tls://{host}:{port}", "--cert", str(cert),
                       "--key", str(key), "--ca", str(ca)])


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
                   help="where worker-ID.pem, worker-ID.key, ca.pem go (default: %(default)s)")
    p.add_argument("--roles", default="cpu", metavar="R[,R...]",
                   help="the roles in the command printed to run the worker (default: cpu)")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        done = uvloop.run(enroll(args.server, args.token, args.ca_sha256, out))
    except EnrolRefused as exc:
        print(f"coord-worker enroll: {exc}", file=sys.stderr)
        return 1
    cert, key, ca = files(out, done.worker_id)
    print(f"enrolled as worker {done.worker_id} (serial {done.serial}): {cert}, {key}, {ca}\n"
          f"run:\n  {run_command(done, args.server, out, args.roles)}")
    if not done.tcp_port:
        print("(PORT: coordd serves no worker listener yet; its listen_tcp port)")
    return 0
