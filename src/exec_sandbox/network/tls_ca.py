"""The certificate authority the interception of secrets' TLS hosts uses: one per Scheduler,
made on first use with the Debian openssl CLI, its key in a private directory (0700) of the
host removed when the Scheduler closes. The guest trusts its certificate (added to the bundle
NET_CONFIG carries); the host's own trust store never does, and the key never leaves the host.

Per scheduler, not per host installation: a key that lived longer or was shared would let one
stolen copy impersonate every secret's host to every VM of every scheduler."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path

from .names import ascii_name

_DAYS = "30"
LEAF_CACHE_MAX = 256
# The extensions strict verifiers (Python 3.13's VERIFY_X509_STRICT, Go) want.
_CA_EXT = (
    "basicConstraints=critical,CA:TRUE,pathlen:0\n"
    "keyUsage=critical,keyCertSign,cRLSign\n"
    "subjectKeyIdentifier=hash\n"
)
_LEAF_EXT = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=serverAuth\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid\n"
    "subjectAltName=DNS:{name}\n"
)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


class InterceptCa:
    """The CA and the server contexts made with it, one per host name. Blocking (openssl runs):
    call off the event loop."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="sbx-intercept-ca-"))  # mode 0700
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}
        try:
            ext = self._dir / "ca.ext"
            ext.write_text(_CA_EXT)
            _openssl(
                "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-days", _DAYS, "-subj", "/CN=exec-sandbox secrets interception CA",
                "-keyout", str(self._dir / "ca.key"), "-out", str(self._dir / "ca.crt"),
                "-extensions", "v3_ca", "-config", str(self._config(ext)),
            )  # fmt: skip
            self.pem = (self._dir / "ca.crt").read_bytes()
        except BaseException:
            self.close()
            raise

    def _config(self, ext: Path) -> Path:
        """An openssl config whose v3_ca section is ext's lines (no system config needed)."""
        config = self._dir / "openssl.cnf"
        config.write_text(
            "[req]\ndistinguished_name=dn\n[dn]\n[v3_ca]\n" + ext.read_text(),
        )
        return config

    def server_context(self, name: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for name (made once), ALPN http/1.1."""
        name = ascii_name(name)
        with self._lock:
            context = self._contexts.get(name)
            if context is not None:
                return context
            key, csr, crt = (self._dir / f"{name}.{s}" for s in ("key", "csr", "crt"))
            ext = self._dir / f"{name}.ext"
            ext.write_text(_LEAF_EXT.format(name=name))
            _openssl(
                "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr),
            )  # fmt: skip
            _openssl(
                "x509", "-req", "-in", str(csr), "-CA", str(self._dir / "ca.crt"),
                "-CAkey", str(self._dir / "ca.key"), "-set_serial",
                str(int.from_bytes(os.urandom(8), "big")), "-days", _DAYS,
                "-extfile", str(ext), "-out", str(crt),
            )  # fmt: skip
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(crt, key)
            context.set_alpn_protocols(["http/1.1"])
            for path in (key, csr, ext):
                path.unlink(missing_ok=True)
            if len(self._contexts) >= LEAF_CACHE_MAX:
                self._contexts.pop(next(iter(self._contexts)))
            self._contexts[name] = context
            return context

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def upstream_context() -> ssl.SSLContext:
    """How the host verifies a secret's real host: its normal trust store (SSL_CERT_FILE and
    SSL_CERT_DIR are honoured, as for any client of the host), ALPN http/1.1."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context
