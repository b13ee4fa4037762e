"""Certificates for mutual TLS between the hosts of a run: a CA of the run's own and one
certificate per host, signed by it, good as both server and client.

    python -m jaxdist.tools.certs DIR --hosts m0,m1          # DIR/ca.pem, ca.key, m0.pem, m0.key, ...
    python experiments/ppo.py --launcher multihost --tls-dir DIR ...   # on every host

Put ``DIR`` where every host reads it (the run's shared filesystem), or copy it to each. A host's
certificate names the host as the host list does (a DNS name, or an IP address), since clients
check it against the address they dial. Keys are written readable by their owner alone. A CA
already in ``DIR`` is kept, so hosts can be added later without re-issuing the others.

``DIR`` must be a directory of your own that no one else may write: a CA found in one that
others could have written may be theirs (every certificate it signs would trust them), and a
file they left there could be read or swapped. Each file is written anew (a new file renamed
into place), never into a file that was there.
Needs ``cryptography`` (``pip install -e '.[tls]' in the jaxdist clone``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import os
import stat
from typing import Any

from jaxdist.courier.tls import CA_FILE

CA_KEY_FILE = "ca.key"


class UntrustedDirectory(PermissionError):
    """The certificates' directory, or a CA in it, could have been written by someone else."""


def make(directory: str, hosts: list[str], days: int = 365) -> list[str]:
    """Writes the CA (unless ``directory`` holds one) and a certificate per host; returns the paths written."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise SystemExit("making certificates needs the cryptography package: pip install -e '.[tls]' in the jaxdist clone") from None

    os.makedirs(directory, mode=0o700, exist_ok=True)
    _check_own(os.path.realpath(directory), stat.S_ISDIR, 0o022)
    now = datetime.datetime.now(datetime.timezone.utc)
    written = []

    def write(name: str, data: bytes, private: bool = False) -> None:
        path = os.path.join(directory, name)
        _write_new(path, data, 0o600 if private else 0o644)
        written.append(path)

    def pem(key: Any) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def builder(subject: str, issuer: x509.Name, public_key: Any) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                .issuer_name(issuer).public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days)))

    ca_cert_path, ca_key_path = os.path.join(directory, CA_FILE), os.path.join(directory, CA_KEY_FILE)
    if os.path.exists(ca_cert_path) and os.path.exists(ca_key_path):
        _check_own(ca_cert_path, stat.S_ISREG, 0o022)
        _check_own(ca_key_path, stat.S_ISREG, 0o077)
        with open(ca_cert_path, "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
        with open(ca_key_path, "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), password=None)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jaxdist run CA")])
        ca_cert = (builder("jaxdist run CA", ca_name, ca_key.public_key())
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        write(CA_KEY_FILE, pem(ca_key), private=True)
        write(CA_FILE, ca_cert.public_bytes(serialization.Encoding.PEM))
    for host in dict.fromkeys(hosts):  # once each, in order
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (builder(host, ca_cert.subject, key.public_key())
                .add_extension(x509.SubjectAlternativeName([_general_name(x509, host)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        write(f"{host}.key", pem(key), private=True)
        write(f"{host}.pem", cert.public_bytes(serialization.Encoding.PEM))
    return written


def _check_own(path: str, kind: Any, forbidden_bits: int) -> None:
    """Raise `UntrustedDirectory` unless `path` (not a symlink) is `kind`, this user's, and has
    none of `forbidden_bits` (the bits that would let others write, or read, it)."""
    status = os.lstat(path)
    if not kind(status.st_mode) or status.st_uid != os.geteuid() or status.st_mode & forbidden_bits:
        raise UntrustedDirectory(
            f"{path} is not a directory of your own, or holds a CA someone else could have written (owner uid "
            f"{status.st_uid}, mode {stat.filemode(status.st_mode)}): make the certificates in a new directory "
            f"that only you can write (mode 0700)")


def _write_new(path: str, data: bytes, mode: int) -> None:
    """`data` in a new file of `mode`, renamed over `path`: a file that was there (open to
    others, or a link) is replaced, never written into."""
    temporary = f"{path}.new-{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _general_name(x509: Any, host: str) -> Any:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jaxdist.tools.certs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="where to write them (made readable by its owner alone)")
    parser.add_argument("--hosts", required=True,
                        help="comma-separated host names or IP addresses, as in the run's host list")
    parser.add_argument("--days", type=int, default=365, help="how long the certificates are valid")
    args = parser.parse_args(argv)
    hosts = [host.strip() for host in args.hosts.split(",") if host.strip()]
    bad = [host for host in hosts if "/" in host or host.startswith(".")]
    if not hosts or bad:
        parser.error(f"--hosts takes host names or addresses separated by commas; got {args.hosts!r}")
    if args.days < 1:
        parser.error(f"--days must be at least 1 (certificates of {args.days} days are never valid)")
    try:
        written = make(args.directory, hosts, args.days)
    except UntrustedDirectory as error:
        parser.error(str(error))
    except OSError as error:  # a directory that cannot be made or written
        parser.error(f"cannot write the certificates into {args.directory}: {error.strerror or error}")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
