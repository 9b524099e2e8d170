"""Enrolment: a new worker gets its mTLS certificate without a key ever being copied.

`coordctl token create --worker ID --ttl 1h` asks coordd (admin) for a one-time token;
coordd keeps only its SHA-256. `coord-worker enroll` makes its key, fetches the CA from the
enrolment listener (`ca_bundle`), checks it against the pinned `--ca-sha256`, and only then,
over a connection that verifies coordd against that CA, sends the token and a CSR
(`enroll`). coordd burns the token in one transaction of its store (coordd.store.api_enrol)
and signs the CSR with the CA key (`tls_ca_key`) as `coordd-worker://<the token's worker
id>`. The rule: a token is good for one certificate; a replay, an unknown or an expired
token is `permission_denied`.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any

from coordd import errors
from coordd.net import pki
from coordd.config import Config
from coordd.rules.names import check_name
from coordd.wire.enrol import CaBundle, Enroll, Enrolled, TokenCreate, TokenCreated
from coordd.store import enrol as estore
from coordd.store.api_enrol import EnrolStore
from coordd.rules.times import fmt_time
from coordd.net.tls import split_host_port

logger = logging.getLogger(__name__)

ENROL_METHODS = ("token_create", "ca_bundle", "enroll")
TOKEN_PREFIX = "cdt_"
TTL_MAX_S = 7 * 86400.0
CSR_MAX_CHARS = 16384


def digest(token: str) -> str:
    """What is stored for a token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


class Enrolment:
    """The enrolment methods over a store's token operations (coordd.store.api_enrol)."""

    METHODS = ENROL_METHODS

    def __init__(self, st: EnrolStore, config: Config) -> None:
        self._store = st
        self._config = config
        self._ca: Any = None  # (certificate, key), loaded at the first use

    def _load_ca(self) -> Any:
        if not self._config.tls_ca_key or not self._config.tls_client_ca:
            raise errors.InvalidState("enrolment is off: coordd has no CA key (set tls_ca_key "
                                      "and tls_client_ca)")
        if self._ca is None:
            from cryptography import x509
            from cryptography.hazmat.primitives import serialization
            try:
                with open(self._config.tls_client_ca, "rb") as fh:
                    ca_pem = fh.read()
                with open(self._config.tls_ca_key, "rb") as fh:
                    key = serialization.load_pem_private_key(fh.read(), None)
                cert = x509.load_pem_x509_certificate(ca_pem)
            except (OSError, ValueError) as exc:
                raise errors.InvalidState(f"enrolment: cannot read the CA: {exc}") from exc
            self._ca = (cert, key, ca_pem.decode())
        return self._ca

    async def token_create(self, p: TokenCreate) -> TokenCreated:
        """Make a one-time token for `p.worker_id` valid `p.ttl_s` seconds (admin)."""
        check_name("worker_id", p.worker_id)
        if not 0 < p.ttl_s <= TTL_MAX_S:
            raise errors.BadRequest(f"ttl_s must be > 0 and <= {TTL_MAX_S:g}, got {p.ttl_s}")
        _cert, _key, ca_pem = self._load_ca()
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        expires = await self._store.add_token(digest(token), p.worker_id, p.ttl_s)
        logger.info("enrolment token made for worker %s (expires %s)", p.worker_id,
                    fmt_time(expires), extra={"action": "token_create", "worker_id": p.worker_id})
        return TokenCreated(token=token, worker_id=p.worker_id, expires_at=expires,
                            ca_sha256=pki.fingerprint(ca_pem.encode()),
                            enroll_address=self._config.listen_enroll)

    async def ca_bundle(self, p: Any = None) -> CaBundle:
        """The fleet CA certificate (public), for the worker to check against its pin."""
        return CaBundle(ca_pem=self._load_ca()[2])

    async def enroll(self, p: Enroll) -> Enrolled:
        """Burn the token and sign the CSR as the token's worker id.

        Raises: PermissionDenied (unknown, used or expired token), BadRequest (bad CSR).
        """
        cert, key, ca_pem = self._load_ca()
        if len(p.csr_pem) > CSR_MAX_CHARS:
            raise errors.BadRequest(f"csr_pem is over {CSR_MAX_CHARS} characters")
        try:  # checked before the token is spent: a bad CSR costs the worker nothing
            pki.sign_csr(cert, key, p.csr_pem.encode(), "probe")
        except pki.PkiError as exc:
            raise errors.BadRequest(f"enroll: {exc}") from exc
        h = digest(p.token)
        state, now = await self._store.token_state(h)  # who the token is for
        worker_id = self._check(state, now)
        pem = pki.sign_csr(cert, key, p.csr_pem.encode(), worker_id)  # outside any transaction
        serial = pki.serial_of(pem)
        await self._store.burn_token(h, serial)  # checked again: at most one enrolment wins
        logger.info("enrolled worker %s (certificate serial %s)", worker_id, serial,
                    extra={"action": "enrolled", "worker_id": worker_id})
        tcp_port = split_host_port(self._config.listen_tcp)[1] if self._config.listen_tcp else 0
        return Enrolled(worker_id=worker_id, cert_pem=pem.decode(), ca_pem=ca_pem, serial=serial,
                        tcp_port=tcp_port)

    _check = staticmethod(estore.usable)
