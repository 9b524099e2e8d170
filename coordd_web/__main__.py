"""coordd-web: serve the web view on a loopback address.

    coordd-web [--socket PATH] [--port 8787] [--host 127.0.0.1] [--actions]
               [--allow-host NAME ...]

With `--actions` a random token is printed at start; the browser opens the printed URL
once (`?token=` becomes a same-site cookie) and every action sends it back.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

WEB_MODULES = frozenset({"starlette", "uvicorn", "jinja2", "markupsafe"})  # the `web` extra

PORT_DEFAULT = 8787


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="coordd-web", description=__doc__.split("\n")[0])
    ap.add_argument("--socket", help="coordd's socket (default: $COORDD_SOCKET or the per-user one)")
    ap.add_argument("--host", default="127.0.0.1",
                    help="loopback address to bind: 127.0.0.1 (the default) or ::1")
    ap.add_argument("--port", type=int, default=PORT_DEFAULT,
                    help=f"TCP port (default {PORT_DEFAULT}; 0: any free one)")
    ap.add_argument("--actions", action="store_true",
                    help="enable cancel/retry/reap (off by default; needs the printed token)")
    ap.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                    help="another Host header name to accept (e.g. behind an SSH tunnel)")
    ap.add_argument("--log-level", default="info")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run coordd-web until SIGINT/SIGTERM/SIGHUP (graceful, then exit 0); exit 1 when it
    cannot listen, 2 on a usage error."""
    args = parse(argv)
    # SIGINT, SIGTERM and SIGHUP (the terminal closed) each stop it, from here on: before
    # uvicorn runs (the imports below take ~0.3 s) by not starting it, after by uvicorn's
    # graceful shutdown. Once done, uvicorn puts back the handlers it found (these) and
    # raises the signal again, which ends in `return 0` rather than in death by SIGTERM
    # (status 143) or a KeyboardInterrupt traceback after Ctrl-C.
    server: Any = None
    stop_asked = False

    def stop(_sig: int, frame: Any) -> None:
        nonlocal stop_asked
        stop_asked = True
        if server is not None:
            server.handle_exit(signal.SIGTERM, frame)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        import uvicorn

        from coordd_web.app import Settings, build_app
        from coordd_web.feed import Feed
        from coordd_web.security import LOOPBACK_HOSTS, new_token
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in WEB_MODULES:
            raise
        print(f"coordd-web: the web view needs the `web` extra ({exc.name} is missing): "
              "pip install 'coordd[web]' (in a checkout: .venv/bin/pip install -e '.[web]')",
              file=sys.stderr)
        return 2
    if args.host not in LOOPBACK_HOSTS:
        print(f"coordd-web: --host must be a loopback address (127.0.0.1, ::1), got "
              f"{args.host!r}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"coordd-web: --port must be 0..65535, got {args.port}", file=sys.stderr)
        return 2
    import socket
    token = new_token() if args.actions else None
    feed = Feed(args.socket)
    app = build_app(Settings(socket=args.socket, actions=args.actions, token=token,
                             allow_hosts=tuple(args.allow_host)), feed)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"coordd-web: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 1
    sock.listen(128)  # connections wait in the backlog until uvicorn serves them
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown}:{port}/"
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=2)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            await feed.close()  # open live streams end now, not at the graceful timeout
            await super().shutdown(sockets)

    server = Server(config)
    if stop_asked:  # stopped while starting
        sock.close()
        return 0
    if token:
        print(f"coordd-web: actions are ON; open {url}?token={token}", flush=True)
    else:
        print(f"coordd-web: read-only view at {url}", flush=True)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
