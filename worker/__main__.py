"""`coord-worker --worker-id ID --roles R[,R...] [--socket PATH | --connect tls://HOST:PORT
--cert PEM --key PEM --ca PEM] [--config FILE] [--readings-override FILE] [--log-json]`:
run the worker supervisor. `coord-worker enroll ...` (worker.enroll) gets this worker's
certificate for --connect first.

SIGHUP is logged and changes nothing (a reload has nothing to re-read).
Exit codes: 0 clean stop (SIGTERM/SIGINT), 2 usage or config error (also: no configured
kind can run here, or this worker id already runs on this work_dir).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from coordd.process_start import ignore_sighup_until_handled, setup_logging
from worker import config as config_mod
from worker.child import restore_default_signals

if TYPE_CHECKING:
    from coordd.client import Client
    from worker.supervisor import Supervisor

logger = logging.getLogger("worker")


ENROLL_USAGE = ("coord-worker enroll --server HOST:PORT --token TOKEN --ca-sha256 FP "
                "[--out DIR] [--roles R[,R...]]")
EPILOG = f"""subcommand:
  {ENROLL_USAGE}
      get this worker's certificate (for --connect tls://) from coordd's enrolment
      listener with a one-time token from `coordctl token create`; see
      `coord-worker enroll --help`
"""


class Parser(argparse.ArgumentParser):
    """coord-worker's parser: a usage error also names `coord-worker enroll`, which a
    worker without its certificate runs first."""

    def error(self, message: str) -> NoReturn:
        """Print the usage, the error and the enroll hint to stderr; exit 2."""
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n(to get a certificate for --connect "
                     f"first: {ENROLL_USAGE}; see coord-worker enroll --help)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (also read by docgen for the configuration reference)."""
    p = Parser(prog="coord-worker", description="Run jobs for coordd.", epilog=EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker-id", required=True, help="this worker's id (unique in the fleet)")
    p.add_argument("--roles", required=True, help="comma-separated roles, e.g. cpu,gpu")
    p.add_argument("--socket", action="append",
                   help="coordd socket (env COORDD_SOCKET; default "
                        "$XDG_RUNTIME_DIR/coordd/coordd.sock, or $XDG_STATE_HOME/coordd/coordd.sock "
                        "when XDG_RUNTIME_DIR is unset); repeat it for an active coordd "
                        "and its standbys (tried in turn; config `socket`)")
    p.add_argument("--connect", metavar="URL", action="append",
                   help="coordd on another host: tls://HOST:PORT (mutual TLS; config `connect`); "
                        "repeat it for an active coordd and its standbys")
    p.add_argument("--cert", help="this worker's certificate (PEM) for tls:// (config tls_cert)")
    p.add_argument("--key", help="its private key (PEM) (config tls_key)")
    p.add_argument("--ca", help="the fleet CA (PEM) coordd's certificate chains to (config tls_ca)")
    p.add_argument("--config", help="worker TOML config (default: built-in kinds)")
    p.add_argument("--readings-override", metavar="FILE",
                   help="a JSON file holding an object whose keys replace probe readings "
                        "(re-read every heartbeat; unknown keys are warned about; a file that cannot "
                        "be used keeps the last good one, no file ends the override)")
    p.add_argument("--log-json", action="store_true", help="log JSON lines")
    return p


async def _run(sup: Supervisor) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sup.request_stop)
    # never SIGHUP's default (exit at once): the model trees, in their own process groups,
    # would run on unsupervised while their leases expire and the jobs run elsewhere
    loop.add_signal_handler(signal.SIGHUP, _on_sighup)
    await sup.run()  # logs "started" once it holds this id's lock
    logger.info("worker %s stopped", sup.worker_id, extra={"action": "worker_exit"})


def _on_sighup() -> None:
    logger.info("SIGHUP: nothing to reload (the config is read at start: restart coord-worker "
                "to apply changes; --readings-override is re-read every heartbeat)",
                extra={"action": "reload"})


def client_factory(args: argparse.Namespace, cfg: config_mod.WorkerConfig) -> Callable[[], Client]:
    """Make the supervisor's Client factory: the Unix socket, or `--connect tls://...`
    (each Client its own Connector: timeouts, backoff, pinned server name; one refusal
    backoff for them all, coordd.transport.Refusals).

    Raises: ValueError (a bad URL, tls:// without files), OSError (unreadable TLS files).
    """
    from coordd.client import Client
    from coordd.failover import Failover
    from coordd.transport import Connector, Refusals, TlsFiles
    from worker.supervisor import CALL_TIMEOUT_S
    urls = args.connect or _listed(cfg.connect)
    if not urls:
        sockets = args.socket or _listed(cfg.socket)
        if len(sockets) > 1:  # an active coordd and its standbys (coordd.failover)
            Failover(sockets)  # a bad address: refused now, not at the first call
            return lambda: Client(connector=Failover(
                sockets, connect_timeout_s=cfg.connect_timeout_s), timeout=CALL_TIMEOUT_S)
        return lambda: Client(sockets[0] if sockets else None, timeout=CALL_TIMEOUT_S)
    url = urls[0]
    files = None
    if any(u.startswith("tls://") for u in urls):
        cert, key, ca = args.cert or cfg.tls_cert, args.key or cfg.tls_key, args.ca or cfg.tls_ca
        missing = [n for n, v in (("--cert", cert), ("--key", key), ("--ca", ca)) if not v]
        if missing:
            raise ValueError(f"{url} needs {', '.join(missing)} (or tls_cert, tls_key, tls_ca "
                             "in the config)")
        files = TlsFiles(cert=cert, key=key, ca=ca)
        named = _cert_worker_id(cert)
        if named != args.worker_id:
            raise ValueError(f"{cert} is the certificate of worker {named or '(none)'}, not "
                             f"{args.worker_id}: coordd would refuse every request")
    refusals = Refusals(cap_s=cfg.refused_backoff_cap_s)  # one backoff for all connections
    if len(urls) > 1:
        Failover(urls, files)  # bad URL or files: refused now, not at the first call
        return lambda: Client(connector=Failover(
            urls, files, connect_timeout_s=cfg.connect_timeout_s, refusals=refusals),
            timeout=CALL_TIMEOUT_S)
    Connector(url, files)  # bad URL or files: refused now, not at the first call
    return lambda: Client(connector=Connector(url, files, connect_timeout_s=cfg.connect_timeout_s,
                                              refusals=refusals), timeout=CALL_TIMEOUT_S)


def _listed(value: str | list[str]) -> list[str]:
    """A config address setting as a list: "" none, a string one, a list several."""
    return [value] if isinstance(value, str) and value else list(value or [])


def _cert_worker_id(path: str) -> str | None:
    from coordd.net import pki
    with open(path, "rb") as fh:
        pem = fh.read()
    try:
        return pki.cert_identity(pem)[0]
    except ValueError as exc:
        raise ValueError(f"{path} is not a PEM certificate: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `coord-worker` command (`coord-worker enroll ...`: worker.enroll)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["enroll"]:
        from worker.enroll import main as enroll_main
        return enroll_main(argv[1:])
    ignore_sighup_until_handled()  # until _run's handler; the imports below take ~0.3 s
    restore_default_signals()  # our models' exit codes are ours; their signals the defaults
    import uvloop
    from worker import orphans
    from worker.supervisor import Supervisor
    args = parse_args(argv)
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    if not args.worker_id.strip() or not roles:
        print("coord-worker: --worker-id and --roles must not be empty", file=sys.stderr)
        return 2
    try:
        cfg = config_mod.load(args.config)
    except config_mod.WorkerConfigError as exc:
        print(f"coord-worker: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_json)
    try:
        os.makedirs(cfg.work_dir, mode=0o700, exist_ok=True)
        # and the id's records folder the supervisor locks: a work_dir that exists but is
        # not ours to write in is refused here, not by a traceback from the lock
        os.makedirs(orphans.records_dir(cfg.work_dir, args.worker_id), mode=0o700,
                    exist_ok=True)
    except OSError as exc:
        where = "" if exc.filename in (None, cfg.work_dir) else f" ({exc.filename})"
        print(f"coord-worker: cannot create work_dir {cfg.work_dir}{where}: {exc.strerror} (set "
              "work_dir in the config, or give the unit a StateDirectory=)", file=sys.stderr)
        return 2
    try:
        factory = client_factory(args, cfg)
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError
        print(f"coord-worker: {exc}", file=sys.stderr)
        return 2
    sup = Supervisor(factory, args.worker_id, roles, cfg, override_path=args.readings_override)
    if not sup.kinds.usable():
        print("coord-worker: no configured kind can run here: " + "; ".join(
            f"{k}: {why}" for k, why in sup.kinds.broken().items()), file=sys.stderr)
        return 2
    try:
        uvloop.run(_run(sup))
    except KeyboardInterrupt:
        return 0
    except orphans.WorkerRunning as exc:
        print(f"coord-worker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
