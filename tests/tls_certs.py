"""Certificates for TLS tests, made with the ``openssl`` command: a CA, a server certificate it
signs for 127.0.0.1 and localhost, and an unrelated CA (to check a refusal)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path               # the CA the servers' certificate chains to (PEM)
    server_cert: Path      # signed by ca, names IP 127.0.0.1 and DNS localhost
    server_key: Path       # its key, PKCS#8 PEM (what Netty reads)
    other_ca: Path         # a CA that signed nothing here
    named_other: Path      # signed by ca, names only other.example (not the address dialled)
    named_other_key: Path
    client_cert: Path      # signed by ca, for client authentication
    client_key: Path


def _run(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"openssl {' '.join(args)}: {out.stderr[-2000:]}"


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    return cert, key


def _leaf(folder: Path, name: str, ca: tuple[Path, Path], san: str,
          usage: str = "serverAuth") -> tuple[Path, Path]:
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    _run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key), cwd=folder)
    _run("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={name}", cwd=folder)
    ext = folder / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                   f"keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n")
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-out", str(cert), "-days", "2", "-extfile", str(ext), cwd=folder)
    return cert, key


def make_certs(folder: Path) -> Certs:
    if shutil.which("openssl") is None:
        from conftest import broker_unavailable
        broker_unavailable("the TLS tests make their certificates with the openssl command")
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca(folder, "test-ca")
    server = _leaf(folder, "server", ca, "IP:127.0.0.1,DNS:localhost")
    other = _leaf(folder, "other", ca, "DNS:other.example")
    client = _leaf(folder, "client", ca, "DNS:client.example", usage="clientAuth")
    return Certs(ca[0], server[0], server[1], _ca(folder, "other-ca")[0], other[0], other[1],
                 client[0], client[1])
