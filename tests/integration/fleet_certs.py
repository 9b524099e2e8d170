"""Certificates for the TLS tests, made by coordd.net.pki (what `coordctl ca` runs), and a
coordd config serving TCP+mTLS on a free loopback port."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from coordd.net import pki
from coordd.transport import Connector, TlsFiles

DAY = 86400.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Fleet:
    """A CA folder with coordd's certificate and a few clients' (good and bad)."""

    ca_dir: Path
    rogue_dir: Path
    port: int

    @property
    def ca(self) -> str:
        return str(self.ca_dir / pki.CA_CERT)

    def files(self, stem: str, folder: Path | None = None) -> TlsFiles:
        d = folder or self.ca_dir
        return TlsFiles(cert=str(d / f"{stem}.pem"), key=str(d / f"{stem}.key"), ca=self.ca)

    def connector(self, stem: str, folder: Path | None = None, **kw) -> Connector:
        return Connector(f"tls://127.0.0.1:{self.port}", self.files(stem, folder),
                         connect_timeout_s=kw.pop("connect_timeout_s", 3.0),
                         backoff_base_s=0.01, backoff_cap_s=0.05, **kw)

    def config(self, extra: str = "") -> str:
        return (f'listen_tcp = "127.0.0.1:{self.port}"\n'
                f'tls_cert = "{self.ca_dir / "server-coordd.pem"}"\n'
                f'tls_key = "{self.ca_dir / "server-coordd.key"}"\n'
                f'tls_client_ca = "{self.ca}"\n' + extra)


def make_fleet(tmp: Path, now: float) -> Fleet:
    """CA + coordd + workers wa, wb + admin ops; a rogue CA's wa; expired / future wa."""
    ca_dir, rogue = tmp / "ca", tmp / "rogue"
    pki.init_ca(ca_dir, now=now)
    pki.issue(ca_dir, server="coordd", ips=["127.0.0.1"], now=now)
    pki.issue(ca_dir, worker="wa", now=now)
    pki.issue(ca_dir, worker="wb", now=now)
    pki.issue(ca_dir, admin="ops", now=now)
    pki.issue(ca_dir, worker="wa", now=now - 100 * DAY, days=10, out_name="expired")
    pki.issue(ca_dir, worker="wa", now=now + DAY, out_name="future")
    pki.init_ca(rogue, name="rogue CA", now=now)
    pki.issue(rogue, worker="wa", now=now)
    return Fleet(ca_dir, rogue, free_port())
