"""coordd's TCP listener for workers on other hosts: the same frames and methods as the Unix
socket (coordd.net.rpc, coordd.net.listener, with the same byte budgets), behind TLS 1.3 and a
required client certificate (coordd.net.tls). Off unless `listen_tcp` is set.
"""

from __future__ import annotations

import functools
import logging
import socket

from coordd.net import tls
from coordd.config import Config
from coordd.net.listener import Listener
from coordd.wire.enrol import ENROL_OPEN_METHODS
from coordd.net.rpc import Dispatcher

logger = logging.getLogger(__name__)


class TcpListener:
    """Bind `config.listen_tcp` and serve `dispatcher` there.

    Args:
        config: listen_tcp, the TLS files, the deny-lists and the TCP timeouts.
        dispatcher: the daemon's dispatcher (shared with the Unix socket).
    Raises (start): ValueError (bad address or TLS files), OSError (cannot bind).
    """

    def __init__(self, config: Config, dispatcher: Dispatcher, enrol: bool = False) -> None:
        self.config = config
        self._dispatcher = dispatcher
        self._listen = config.listen_enroll if enrol else config.listen_tcp
        files: tuple[str, str, str | None] | None = None if config.tcp_insecure_plaintext \
            else (config.tls_cert, config.tls_key, None if enrol else config.tls_client_ca)
        try:
            self.tls = tls.TlsServer(files, tls.DenyList.of(config.tls_deny_workers,
                                                            config.tls_deny_serials),
                                     ENROL_OPEN_METHODS if enrol else None)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ValueError(f"TLS files ({', '.join(f for f in files or () if f)}): {exc}") \
                from exc
        self._listener: Listener | None = None
        self.address = ""

    def start(self) -> str:
        """Bind and start accepting; return the bound "host:port"."""
        host, port = tls.split_host_port(self._listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=512)
        bound = sock.getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 \
            else f"{bound[0]}:{bound[1]}"
        user_timeout = self.config.tcp_user_timeout_s
        self._listener = Listener(
            sock, functools.partial(self._dispatcher.accept, peer_of=self.tls.peer_of),
            tls=self.tls.current, tune=lambda s: tls.tune_tcp(s, user_timeout),
            handshake_timeout_s=self.config.tls_handshake_timeout_s,
            on_refused=self.tls.handshake_refused)
        self._listener.start()
        logger.info("serving %s on %s://%s", "enrolment" if self.tls.open_methods else "workers",
                    "tcp" if self.tls.files is None else "tls", self.address,
                    extra={"action": "listen_tcp", "address": self.address})
        if self.tls.files is None:
            logger.warning("the TCP listener is PLAINTEXT with no identities "
                           "(tcp_insecure_plaintext, a test mode)",
                           extra={"action": "tcp_insecure_plaintext"})
        return self.address

    def reload(self, fresh: Config | None) -> None:
        """SIGHUP: new certificates for new handshakes (open connections keep theirs), and
        the deny-lists of `fresh` (the config file as coordd.config loaded it again; None:
        it did not load, the deny-lists stay); open connections of peers denied now close."""
        deny = None if fresh is None else tls.DenyList.of(fresh.tls_deny_workers,
                                                         fresh.tls_deny_serials)
        self.tls.reload(deny)
        for conn in self._dispatcher.connections():
            why = self.tls.denied_now(conn.peer)
            if why is not None:
                logger.warning("closing the connection of %r: %s", conn.peer, why,
                               extra={"action": "peer_denied"})
                conn.close()

    def close(self) -> None:
        """Stop accepting (open connections are the dispatcher's to close)."""
        if self._listener is not None:
            self._listener.close()

    async def wait_closed(self) -> None:
        """Wait for accepted connections still being set up (handshakes)."""
        if self._listener is not None:
            await self._listener.wait_closed()
