"""An identity's ca_file: checked when the config is read (each problem naming its path),
and the context it makes verifies certificates and host names — never less."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from watchd.config.fields import ConfigError
from watchd.config.model import Config
from watchd.config.secrets import resolve_secrets
from watchd.kits.tls import trust
from watchd.sim import certs


def _config(tmp_path: Path, ca_file: str) -> Config:
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o600)
    return Config.model_validate(
        {
            "identities": [
                {
                    "name": "a",
                    "url": "https://coder.example.com",
                    "token_file": str(token),
                    "ca_file": ca_file,
                }
            ]
        }
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read the CA file"),
        (b"not a certificate\n", "holds no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n", "is not a PEM"),
    ],
    ids=["missing", "not-pem", "broken-pem"],
)
def test_a_ca_file_that_cannot_serve_is_a_config_problem_naming_it(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    """A missing, non-PEM or unparsable ca_file is a config problem naming the identity's
    path and the file, with what is wrong."""
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_bytes(content)
    with pytest.raises(ConfigError) as failed:
        resolve_secrets(_config(tmp_path, str(ca)))
    (problem,) = failed.value.problems
    assert problem.startswith("identities.0.ca_file (a): ")
    assert str(ca) in problem and says in problem


def test_the_simulators_ca_makes_a_verifying_context(tmp_path: Path) -> None:
    """The simulator's generated CA passes the check, and the context built from it
    checks host names and requires a verified certificate."""
    made = certs.make(tmp_path)
    resolve_secrets(_config(tmp_path, str(made.ca_file)))
    ctx = trust(str(made.ca_file))
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
