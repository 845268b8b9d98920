"""Real certificates for the TLS tests, made with the ``openssl`` command: a CA, a server
certificate for 127.0.0.1 and localhost signed by it, a client certificate signed by it,
and a second CA that signed nothing the servers use (a client trusting it must refuse
them). EC keys (P-256): quick to make, as good as RSA for a test."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _key(path: Path) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(path)]  # fmt: skip


def certificates(directory: Path) -> dict[str, str]:
    """The files' paths by name: ``ca.pem``/``ca.key``, ``server.pem``/``server.key``,
    ``client.pem``/``client.key``, ``other-ca.pem``/``other-ca.key``."""
    directory.mkdir(parents=True, exist_ok=True)
    names = ("ca", "other-ca", "server", "client")
    files = {f"{n}.{x}": str(directory / f"{n}.{x}") for n in names for x in ("pem", "key")}
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *_key(directory / f"{ca}.key"), "-days", "2",
                 "-subj", f"/CN=tidings test {ca}", "-out", files[f"{ca}.pem"])  # fmt: skip
    extensions = {
        "server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        "client": "extendedKeyUsage=clientAuth\n",
    }
    for name, extension in extensions.items():
        csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
        ext.write_text(extension)
        _openssl("req", *_key(directory / f"{name}.key"), "-subj", f"/CN={name}",
                 "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", files["ca.pem"], "-CAkey",
                 files["ca.key"], "-CAcreateserial", "-days", "2", "-out",
                 files[f"{name}.pem"], "-extfile", str(ext))  # fmt: skip
    return files
