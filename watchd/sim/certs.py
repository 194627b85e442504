"""A throwaway certificate authority and server certificate for ``watchd sim --tls``.

Made with the ``openssl`` command (in every Debian and the python images; the
``cryptography`` package is not among watchd's dependencies), into a folder the caller
owns and removes. Two tiers, as production deployments have them: a self-signed CA the
client is told to trust (``ca.pem``, an identity's ``ca_file``), and a server certificate
it signed for ``localhost``, 127.0.0.1 and ::1. Valid for two days: never a credential.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

_LEAF_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


class CertError(RuntimeError):
    """The certificates could not be made (no ``openssl``, or it failed)."""


@dataclass(frozen=True)
class Certs:
    ca_file: Path  # what the client trusts
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def _openssl(*args: str, cwd: Path) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)
    except subprocess.CalledProcessError as exc:
        said = exc.stderr.decode(errors="replace")
        raise CertError(f"openssl {args[0]} failed: {said}") from None


def make(folder: Path) -> Certs:
    """A CA and a server certificate signed by it, written into ``folder``."""
    if shutil.which("openssl") is None:
        raise CertError("--tls needs the openssl command (apt-get install openssl)")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=watchd simulator CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "req", *ec, "-keyout", "key.pem", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=folder,
    )  # fmt: skip
    (folder / "server.ext").write_text(_LEAF_EXTENSIONS)
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-set_serial", "1", "-days", "2", "-extfile", "server.ext", "-out", "cert.pem",
        cwd=folder,
    )  # fmt: skip
    return Certs(
        ca_file=folder / "ca.pem", cert_file=folder / "cert.pem", key_file=folder / "key.pem"
    )
