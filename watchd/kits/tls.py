"""Trust in a private certificate authority: a verifying TLS context from a PEM file.

What it must not do: build a context that skips verification. A deployment behind a
private CA (or a self-signed certificate) is trusted by naming that CA, never by turning
certificate or host-name checks off.
"""

from __future__ import annotations

import ssl
from pathlib import Path

# A CA bundle is a few certificates; the system's own is about 200 KiB.
MAX_CA_BYTES = 1024 * 1024
_PEM = b"-----BEGIN CERTIFICATE-----"


def trust(ca_file: str) -> ssl.SSLContext:
    """A client context that trusts exactly the certificates in ``ca_file`` (PEM), with
    host names checked. ValueError names the file and what is wrong with it."""
    try:
        with Path(ca_file).open("rb") as f:
            data = f.read(MAX_CA_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the CA file {ca_file}: {exc.strerror or exc}") from None
    if len(data) > MAX_CA_BYTES:
        raise ValueError(f"the CA file {ca_file} is over {MAX_CA_BYTES // 1024} KiB")
    if _PEM not in data:
        raise ValueError(f"the CA file {ca_file} holds no PEM certificate ({_PEM.decode()})")
    try:
        # cadata given: the system's roots are not loaded, only these (curl's --cacert).
        return ssl.create_default_context(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise ValueError(
            f"the CA file {ca_file} is not a PEM certificate bundle: {reason}"
        ) from None
