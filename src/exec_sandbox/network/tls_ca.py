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
import time
from pathlib import Path

from .names import ascii_name

VALID_DAYS = 30
# Certificates are dated from a day back: a guest restored from an older snapshot runs a clock
# behind the host's until it is corrected, and would find a certificate of now not yet valid.
BACKDATE_SECONDS = 24 * 3600
LEAF_CACHE_MAX = 256
_CONFIG = """\
[ca]
default_ca = sbx
[sbx]
database = {dir}/index.txt
new_certs_dir = {dir}
serial = {dir}/serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
[req]
distinguished_name = dn
[dn]
[v3_ca]
basicConstraints = critical,CA:TRUE,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
"""
# The extensions strict verifiers (Python 3.13's VERIFY_X509_STRICT, Go) want.
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


def _dates() -> list[str]:
    now = time.time()
    fmt = "%Y%m%d%H%M%SZ"
    start = time.strftime(fmt, time.gmtime(now - BACKDATE_SECONDS))
    end = time.strftime(fmt, time.gmtime(now + VALID_DAYS * 86400))
    return ["-startdate", start, "-enddate", end]


class InterceptCa:
    """The CA and the server contexts made with it, one per host name. Blocking (openssl runs):
    call off the event loop."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="sbx-intercept-ca-"))  # mode 0700
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}
        try:
            self._config = self._dir / "openssl.cnf"
            self._config.write_text(_CONFIG.format(dir=self._dir))
            (self._dir / "index.txt").write_text("")
            (self._dir / "serial").write_text(os.urandom(8).hex() + "\n")
            csr = self._dir / "ca.csr"
            _openssl(
                "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-subj", "/CN=exec-sandbox secrets interception CA", "-config", str(self._config),
                "-keyout", str(self._dir / "ca.key"), "-out", str(csr),
            )  # fmt: skip
            _openssl(
                "ca", "-batch", "-notext", "-selfsign", "-config", str(self._config),
                "-keyfile", str(self._dir / "ca.key"), "-in", str(csr), "-extensions", "v3_ca",
                "-out", str(self._dir / "ca.crt"), *_dates(),
            )  # fmt: skip
            self.pem = (self._dir / "ca.crt").read_bytes()
        except BaseException:
            self.close()
            raise

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
                "-subj", f"/CN={name}", "-config", str(self._config),
                "-keyout", str(key), "-out", str(csr),
            )  # fmt: skip
            _openssl(
                "ca", "-batch", "-notext", "-config", str(self._config),
                "-cert", str(self._dir / "ca.crt"), "-keyfile", str(self._dir / "ca.key"),
                "-in", str(csr), "-extfile", str(ext), "-out", str(crt), *_dates(),
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
