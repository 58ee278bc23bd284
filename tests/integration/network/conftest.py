"""Fixtures of the network tests: HTTP(S) servers on this host's loopback, and schedulers whose
test-only hosts map (SchedulerConfig.network_test_hosts) sends a few names to them. Nothing here
reaches beyond 127.0.0.1."""

from __future__ import annotations

import http.server
import os
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exec_sandbox import Scheduler
from tests.helpers import open_fds, private_config, qemu_processes

BODY = b"hello from the host's loopback\n"


class _Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/big/"):
            size = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[: min(size, len(chunk))])
                size -= len(chunk)
            return
        if self.path == "/" or self.path == "/hello":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
            return
        super().do_GET()  # files of the served directory (the git repository)

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Servers:
    http_port: int
    https_port: int
    ca_file: Path
    root: Path


def _make_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for web.test (openssl CLI)."""
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt = directory / "srv.key", directory / "srv.csr", directory / "srv.crt"
    ext = directory / "ext.cnf"
    # What X.509 strict verification (python >= 3.13's default) asks of a leaf: its key's use and
    # the key identifier of the CA that signed it.
    ext.write_text(
        "subjectAltName=DNS:web.test,DNS:*.web.test\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=exec-sandbox test CA",
        # And of a CA: what its key may sign.
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca_crt),
    )
    run(
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=web.test",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    run(
        "openssl",
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_crt),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
    )
    return ca_crt, crt, key


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("www")
    ca, crt, key = _make_ca(tmp_path_factory.mktemp("ca"))
    handler = lambda *a, **k: _Handler(*a, directory=str(root), **k)  # noqa: E731
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    secure = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (plain, secure)]
    for t in threads:
        t.start()
    yield Servers(plain.server_address[1], secure.server_address[1], ca, root)
    for s in (plain, secure):
        s.shutdown()
        s.server_close()


@pytest.fixture
async def net_scheduler(
    images_ready: None, servers: Servers, tmp_path: Path
) -> AsyncIterator[Scheduler]:
    """A Scheduler whose test hosts map sends web.test (80 and 443) to the loopback servers."""
    fds_before = open_fds()
    config = private_config(
        tmp_path,
        network_test_hosts={
            "web.test:80": f"127.0.0.1:{servers.http_port}",
            "web.test:443": f"127.0.0.1:{servers.https_port}",
            "api.web.test:80": f"127.0.0.1:{servers.http_port}",
        },
        network_ca_bundle=servers.ca_file,
    )
    async with Scheduler(config) as sched:
        yield sched
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"
    leaked = {fd for fd in open_fds() - fds_before if not fd.startswith("anon_inode:[event")}
    assert not leaked, f"fds outlived the Scheduler: {leaked}"
