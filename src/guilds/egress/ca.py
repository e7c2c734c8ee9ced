"""The orchestrator's certificate authority, for the hosts a secret is for.

The egress proxy terminates TLS only for the hosts a secret names, with a leaf
certificate this authority signs; every command in the sandbox trusts it through
the trust bundle (``trust_bundle``: the authority plus the host's roots).

The authority is made on first use in a folder of the data folder (``egress/``):
``ca.pem`` (the certificate, 0644) and ``ca.key`` (its private key, 0600), the
folder 0700. Many proxies starting at once make it once (a lock file). Leaf
certificates are made per host and kept in memory only, as ready TLS contexts.

Where the data folder's egress folder holds a shared key
(``guilds.sandbox.egress_side.files.shared_key``), the authority's private key is
derived from it: servers that share it sign with one key under one name, so a
sandbox trusting one's certificate trusts the leaves of all of them. An authority
of another key found in the folder is made anew.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .policy import address_of
from .shared_key import derived_key, shared_key

CA_NAME = "guilds egress authority"
"""The authority's common name (what a client's error shows as the issuer)."""
CA_DAYS = 3650
"""The authority lives ten years: the trust bundle given to sandboxes names it."""
LEAF_DAYS = 30
"""A leaf lives 30 days; a proxy lives as long as its sandbox, and makes a new one when it starts."""
BACKDATE = datetime.timedelta(hours=1)
"""Certificates start an hour early, for clocks a little behind."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key(seed: bytes | None = None) -> ec.EllipticCurvePrivateKey:
    """A fresh key, or the one seed gives (the same seed, the same key)."""
    if seed is None:
        return ec.generate_private_key(ec.SECP256R1())
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # SECP256R1's n
    return ec.derive_private_key(int.from_bytes(seed, "big") % (order - 1) + 1, ec.SECP256R1())


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """data into path atomically (a temporary file renamed), with mode."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _make_ca(folder: Path, seed: bytes | None = None) -> None:
    key = _new_key(seed)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - BACKDATE).not_valid_after(_now() + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    _write_private(folder / "ca.key", key_pem, 0o600)
    _write_private(folder / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def host_roots_file() -> Path | None:
    """The host's trust store as one PEM file: SSL_CERT_FILE when set, else OpenSSL's default file."""
    env = os.environ.get("SSL_CERT_FILE")
    paths = ssl.get_default_verify_paths()
    for candidate in (env, paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _read_key(folder: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{folder / 'ca.key'}: not the authority's key")
    return key


def _of_seed(key: ec.EllipticCurvePrivateKey, seed: bytes) -> bool:
    return key.private_numbers().private_value == _new_key(seed).private_numbers().private_value


class CertificateAuthority:
    """The authority of one data folder; ``open`` makes it on first use."""

    def __init__(self, folder: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.folder = folder
        self.cert = cert
        self._key = key
        self._leaves: dict[str, ssl.SSLContext] = {}

    @classmethod
    def open(cls, folder: str | os.PathLike[str]) -> CertificateAuthority:
        """The authority kept in folder, made there (0700, key 0600) when it has none."""
        path = Path(folder)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        shared = shared_key(path.parent)
        seed = None if shared is None else derived_key(shared, "authority")
        with open(path / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / "ca.key").exists() or (seed is not None and not _of_seed(_read_key(path), seed)):
                _make_ca(path, seed)
        return cls(path, x509.load_pem_x509_certificate((path / "ca.pem").read_bytes()), _read_key(path))

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def trust_bundle(self, path: str | os.PathLike[str]) -> Path:
        """Write this authority plus the host's roots into path (0644, atomically); return it."""
        roots = host_roots_file()
        data = self.cert_pem + (b"\n" + roots.read_bytes() if roots else b"")
        target = Path(path)
        _write_private(target, data, 0o644)
        return target

    def leaf_pem(self, host: str) -> tuple[bytes, bytes]:
        """(certificate chain, private key) in PEM of a new leaf for host (a name or an address)."""
        key = _new_key()
        address = address_of(host)
        alt: x509.GeneralName = (x509.IPAddress(ipaddress.ip_address(address)) if address
                                 else x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - BACKDATE).not_valid_after(_now() + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem, key_pem

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf for host, made once per host."""
        context = self._leaves.get(host)
        if context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            chain, key = self.leaf_pem(host)
            with tempfile.TemporaryDirectory() as scratch:  # load_cert_chain reads files only
                (Path(scratch) / "leaf.pem").write_bytes(chain + key)
                context.load_cert_chain(Path(scratch) / "leaf.pem")
            self._leaves[host] = context
        return context
