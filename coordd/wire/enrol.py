"""Wire Structs of enrolment (issue 18): `token_create` (admin), `ca_bundle` and `enroll`
(the only methods served on the enrolment listener). Data only, no I/O.

Registered in coordd.wire.protocol's PARAMS and ADMIN_METHODS. Same evolution rules: new
fields get defaults and go last; a field's type never changes.
"""

from __future__ import annotations

import msgspec


class TokenCreate(msgspec.Struct, kw_only=True):
    """`token_create` (admin): a one-time enrolment token for `worker_id`, valid `ttl_s`."""

    worker_id: str
    ttl_s: float = 3600.0


class TokenCreated(msgspec.Struct, kw_only=True):
    """`token_create` result: the token (shown once; coordd keeps only its SHA-256)."""

    token: str
    worker_id: str
    expires_at: float
    ca_sha256: str
    enroll_address: str = ""  # coordd's listen_enroll as configured ("" = off)


class CaBundle(msgspec.Struct, kw_only=True):
    """`ca_bundle` result: the fleet CA certificate(s) (PEM), to check against a pinned
    SHA-256 before anything secret is sent."""

    ca_pem: str


class Enroll(msgspec.Struct, kw_only=True):
    """`enroll`: a one-time token and a PEM CSR for the key the worker made itself."""

    token: str
    csr_pem: str


class Enrolled(msgspec.Struct, kw_only=True):
    """`enroll` result: the worker's certificate (its id from the token) and the CA."""

    worker_id: str
    cert_pem: str
    ca_pem: str
    serial: str
    tcp_port: int = 0  # the port of coordd's listen_tcp (0 = not serving workers over TCP)


ENROL_PARAMS: dict[str, type[msgspec.Struct]] = {
    "token_create": TokenCreate,
    "ca_bundle": msgspec.defstruct("CaBundleParams", []),
    "enroll": Enroll,
}
"""The enrolment methods and their params Structs (merged into protocol.PARAMS)."""

ENROL_ADMIN_METHODS = frozenset({"token_create"})
ENROL_OPEN_METHODS = frozenset({"ca_bundle", "enroll"})
"""What a peer without a client certificate may call (on `listen_enroll` only)."""
