"""Certificates for a Dask cluster that only tokenmill's own processes can use: mutual TLS, where the scheduler,
every worker and the flow's client each show a certificate signed by the cluster's own certificate authority,
and refuse a peer without one. A scheduler reachable over a network runs whatever it is sent (pickled
functions) on workers that hold the object store's credentials: without TLS, anything that reaches its port
runs code with them. `tokenmill certs DIR` writes:

- `ca.pem` (the authority's certificate, for every process) and `ca-key.pem` (its key: keep it off the cluster;
  it signs new certificates);
- `scheduler.pem`, `worker.pem`, `client.pem` and their `-key.pem` keys, one per role (keys readable by their
  owner only): the client's for connecting only, the others' for serving and connecting.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("scheduler", "worker", "client")
AUTHORITY = "tokenmill cluster CA"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _private_directory(directory: Path) -> int:
    """`directory` (made mode 0700 where missing) open, once checked to be this user's and closed to others: a
    directory another user made could hold their file or link under a key's name, or let them read the keys. One of
    this user's that others can enter is closed (chmod 0700)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    found = os.fstat(descriptor)
    if found.st_uid != os.getuid():
        os.close(descriptor)
        raise PermissionError(
            f"{directory} belongs to another user (uid {found.st_uid}): its owner could read or replace the keys; "
            "give a directory of your own (a new one is made, mode 0700)"
        )
    if found.st_mode & 0o077:
        os.fchmod(descriptor, 0o700)
    return descriptor


def _write(directory: int, name: str, data: bytes) -> None:
    """A new file `name` in the open directory, mode 0600: never one already there, never through a link."""
    try:
        descriptor = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=directory)
    except FileExistsError:
        raise FileExistsError(f"{name} exists already: give a new directory (nothing there was replaced)") from None
    with os.fdopen(descriptor, "wb") as f:
        f.write(data)


def _subject_names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(["localhost", "127.0.0.1", *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_certificates(
    directory: Path, hosts: list[str], days: int = 365, keep_authority_key: bool = True
) -> list[Path]:
    """A new authority and a certificate per role (ROLES) signed by it, valid `days` days for `hosts` (and
    localhost), written into `directory`; the files written. Without `keep_authority_key` the authority's key is
    never written (a run's own certificates, on storage the nodes share: none can sign another). Refuses to
    replace an existing authority (the certificates it signed would stop working) or any file: each is made anew
    (`O_EXCL|O_NOFOLLOW`), mode 0600, in a directory of this user's closed to others (`_private_directory`)."""
    if (directory / "ca.pem").exists():
        raise FileExistsError(f"{directory / 'ca.pem'} exists: give another directory, or remove it to start over")
    opened = _private_directory(directory)
    try:
        return _make_certificates(directory, opened, hosts, days, keep_authority_key)
    except FileExistsError as e:
        raise FileExistsError(f"{directory}/{e}") from None
    finally:
        os.close(opened)


def _make_certificates(
    directory: Path, opened: int, hosts: list[str], days: int, keep_authority_key: bool
) -> list[Path]:
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(AUTHORITY))
        .issuer_name(_name(AUTHORITY))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(ca_key, hashes.SHA256())
    )
    written = [directory / "ca.pem"]
    _write(opened, "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    if keep_authority_key:
        written.append(directory / "ca-key.pem")
        _write(opened, "ca-key.pem", _key_bytes(ca_key))
    both = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    for role in ROLES:  # the scheduler and the workers connect and are connected to; the client only connects
        usages = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]) if role == "client" else both
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(f"tokenmill {role}"))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(_subject_names(hosts)), critical=False)
            .add_extension(usages, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write(opened, f"{role}.pem", certificate.public_bytes(serialization.Encoding.PEM))
        _write(opened, f"{role}-key.pem", _key_bytes(key))
        written += [directory / f"{role}.pem", directory / f"{role}-key.pem"]
    return written


def usage(directory: Path) -> list[str]:
    """How each process uses the certificates in `directory`: the commands and the environment."""
    d = directory.resolve()
    tls = f"--tls-ca-file {d}/ca.pem"
    roles = "flows.clusters.roles"  # its preload keeps the workers' certificate from acting as a client's
    return [
        f"the scheduler:  dask scheduler --protocol tls {tls} --tls-cert {d}/scheduler.pem "
        f"--tls-key {d}/scheduler-key.pem --preload {roles}",
        f"each worker:    dask worker tls://SCHEDULER:8786 {tls} --tls-cert {d}/worker.pem "
        f"--tls-key {d}/worker-key.pem --preload {roles} --preload-nanny {roles}",
        "the flow (tokenmill run, serve, a Prefect worker), in its environment:",
        "  TOKENMILL_DASK_ADDRESS=tls://SCHEDULER:8786",
        f"  DASK_DISTRIBUTED__COMM__TLS__CA_FILE={d}/ca.pem",
        f"  DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT={d}/client.pem",
        f"  DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY={d}/client-key.pem",
        "  DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True",
        f"Keep {d}/ca-key.pem off the cluster: it signs new certificates.",
    ]
