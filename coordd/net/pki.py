"""The fleet's small private CA (built on `cryptography`): make the CA, issue leaf
certificates for coordd, workers and admins, sign a worker's CSR (enrolment).

Identities live in URI SANs: `coordd-worker://<worker_id>` and `coordd-admin://<name>`
(clientAuth only, so a stolen worker certificate cannot pass as the server); coordd's own
certificate names `DNS:coordd` (the pinned server name), clientAuth never. Keys are ECDSA
P-256; leaves last LEAF_DAYS with notBefore backdated BACKDATE_S (clock skew); the CA lasts
CA_DAYS. Every key and certificate file is written 0600 and never overwritten.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from coordd.clock import SystemClock
from coordd.rules.names import check_name
from coordd.net.tls import ADMIN_SCHEME, WORKER_SCHEME

LEAF_DAYS = 90
CA_DAYS = 3650
BACKDATE_S = 3600.0
SERVER_NAME = "coordd"
"""The name every worker pins (`server_hostname`), whatever address it dials."""
FILE_MODE = 0o600
CA_CERT, CA_KEY = "ca.pem", "ca.key"


class PkiError(Exception):
    """A CA folder, file or request that cannot be used; the message says why."""


@dataclass(frozen=True)
class Issued:
    """Paths of an issued certificate and its key, and the certificate's serial (hex)."""

    cert: Path
    key: Path
    serial: str


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    """The certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def fingerprint(pem: bytes) -> str:
    """SHA-256 of the (first) certificate's DER, as lowercase hex (what `--ca-sha256` takes)."""
    cert = x509.load_pem_x509_certificate(pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def write_private(path: Path, data: bytes) -> None:
    """Create `path` with mode 0600 and write `data`; an existing file is never replaced.

    Raises: PkiError (the file exists, or cannot be written).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        raise PkiError(f"{path} exists; not overwriting it (remove it first)") from None
    except OSError as exc:
        raise PkiError(f"cannot create {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _when(now: float | None) -> dt.datetime:
    return dt.datetime.fromtimestamp(SystemClock().wall() if now is None else now, dt.timezone.utc)


def init_ca(folder: str | os.PathLike[str], name: str = "coordd fleet CA",
            now: float | None = None) -> Issued:
    """Make a CA key and self-signed certificate (`ca.key`, `ca.pem`) in `folder`
    (created 0700 if missing).

    Raises: PkiError (a CA is already there, or the folder cannot be written).
    """
    folder = Path(folder)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise PkiError(f"cannot create {folder}: {exc.strerror or exc}") from exc
    if (folder / CA_KEY).exists() or (folder / CA_CERT).exists():
        raise PkiError(f"{folder} already holds a CA ({CA_CERT} / {CA_KEY}); not replacing it")
    key = new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = _when(now) - dt.timedelta(seconds=BACKDATE_S)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    write_private(folder / CA_KEY, key_pem(key))
    write_private(folder / CA_CERT, cert_pem(cert))
    return Issued(folder / CA_CERT, folder / CA_KEY, format(cert.serial_number, "x"))


def load_ca(folder: str | os.PathLike[str]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Read `ca.pem` and `ca.key` from `folder`. Raises: PkiError."""
    folder = Path(folder)
    try:
        cert = x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((folder / CA_KEY).read_bytes(), None)
    except OSError as exc:
        raise PkiError(f"no CA in {folder}: {exc.strerror or exc} (run `coordctl ca init "
                       f"{folder}`)") from exc
    except ValueError as exc:
        raise PkiError(f"the CA in {folder} is not readable: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{folder / CA_KEY} is not an EC key")
    return cert, key


def build_leaf(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
               public_key: ec.EllipticCurvePublicKey, common_name: str,
               sans: list[x509.GeneralName], server: bool, *, now: float | None = None,
               days: float = LEAF_DAYS, backdate_s: float = BACKDATE_S) -> x509.Certificate:
    """Sign a leaf for `public_key`: `sans` as its subjectAltName, EKU serverAuth when
    `server`, else clientAuth only; valid from `now - backdate_s` for `days` days."""
    start = _when(now) - dt.timedelta(seconds=backdate_s)
    eku = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))


def identity_sans(worker: str | None = None, admin: str | None = None) -> list[x509.GeneralName]:
    """The URI SAN of a worker id or an admin name (checked as coordd checks names)."""
    out: list[x509.GeneralName] = []
    if worker is not None:
        check_name("worker_id", worker)
        out.append(x509.UniformResourceIdentifier(WORKER_SCHEME + worker))
    if admin is not None:
        check_name("admin name", admin)
        out.append(x509.UniformResourceIdentifier(ADMIN_SCHEME + admin))
    return out


def issue(folder: str | os.PathLike[str], *, worker: str | None = None,
          admin: str | None = None, server: str | None = None, ips: list[str] | None = None,
          dns: list[str] | None = None, now: float | None = None, days: float = LEAF_DAYS,
          out_name: str | None = None) -> Issued:
    """Issue one leaf from the CA in `folder`, its key made here; written beside the CA as
    `worker-ID.pem/.key`, `admin-NAME...` or `server-NAME...` (or `out_name`).

    Exactly one of `worker`, `admin`, `server` is given. A server certificate names
    `DNS:coordd` (SERVER_NAME) plus `server`, `dns` and `ips` as SANs.
    Raises: PkiError (no CA, a file in the way, a bad name or address).
    """
    import ipaddress

    if sum(x is not None for x in (worker, admin, server)) != 1:
        raise PkiError("say exactly one of --worker ID, --admin NAME, --server NAME")
    ca_cert, ca_key = load_ca(folder)
    try:
        if server is not None:
            names = dict.fromkeys([SERVER_NAME, server, *(dns or [])])
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips or []]
            stem, cn = f"server-{server}", server
        else:
            sans = identity_sans(worker, admin)
            stem = f"worker-{worker}" if worker is not None else f"admin-{admin}"
            cn = worker if worker is not None else str(admin)
    except ValueError as exc:
        raise PkiError(f"bad address: {exc}") from exc
    except Exception as exc:  # CoordError from check_name
        raise PkiError(str(exc)) from exc
    key = new_key()
    cert = build_leaf(ca_cert, ca_key, key.public_key(), cn, sans, server is not None,
                      now=now, days=days)
    stem = out_name or stem
    base = Path(folder)
    write_private(base / f"{stem}.key", key_pem(key))
    write_private(base / f"{stem}.pem", cert_pem(cert))
    return Issued(base / f"{stem}.pem", base / f"{stem}.key", format(cert.serial_number, "x"))


def sign_csr(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, csr_pem: bytes,
             worker_id: str, now: float | None = None) -> bytes:
    """Sign a worker's CSR as `coordd-worker://worker_id` (enrolment): only the CSR's
    public key is used; names and extensions it asks for are ignored.

    Raises: PkiError (not a CSR, a bad signature, not a P-256 key).
    """
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise PkiError(f"not a PEM certificate request: {exc}") from exc
    if not csr.is_signature_valid:
        raise PkiError("the certificate request's signature does not verify")
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or \
            not isinstance(public_key.curve, ec.SECP256R1):
        raise PkiError("the certificate request's key is not ECDSA P-256")
    cert = build_leaf(ca_cert, ca_key, public_key, worker_id, identity_sans(worker=worker_id),
                      False, now=now)
    return cert_pem(cert)


def serial_of(pem: bytes) -> str:
    """A certificate's serial number, lowercase hex."""
    return format(x509.load_pem_x509_certificate(pem).serial_number, "x")


def cert_identity(pem: bytes) -> tuple[str | None, str | None]:
    """(worker id, admin name) named by a certificate's URI SANs (None where absent)."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        uris = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        return None, None
    worker = next((u[len(WORKER_SCHEME):] for u in uris if u.startswith(WORKER_SCHEME)), None)
    admin = next((u[len(ADMIN_SCHEME):] for u in uris if u.startswith(ADMIN_SCHEME)), None)
    return worker, admin


def make_csr(key: ec.EllipticCurvePrivateKey, worker_id: str) -> bytes:
    """A CSR for `key` naming `worker_id` (the worker's side of enrolment)."""
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, worker_id)]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM)


def leaf_problem(cert_pem: bytes, ca_pem: bytes, now: float) -> str | None:
    """Why coordd would refuse this leaf certificate, as far as this host can tell: not
    issued by any CA certificate in `ca_pem` (the fleet CA), expired, or not yet valid at
    `now` (Unix seconds); None if none of these (or the files do not parse)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        return None
    issued = False
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            issued = True
        except (ValueError, TypeError, InvalidSignature):
            continue
    if not issued:
        return (f"it is issued by {cert.issuer.rfc4514_string()}, not by the fleet CA "
                f"({', '.join(ca.subject.rfc4514_string() for ca in cas)})")
    when = _when(now)
    if when > cert.not_valid_after_utc:
        return f"it expired at {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    if when < cert.not_valid_before_utc:
        return (f"it is not valid before {cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} "
                f"(check this host's clock)")
    return None
