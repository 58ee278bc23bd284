"""Secrets' interception against the plain byte relay, in one run on this machine:

the same loopback HTTP(S) server (a child process, keep-alive) is reached from one VM under two
names: `relay.test` through the byte relay (no secret: TLS ends at the server), `secret.test`
with a secret (TLS ended by the scheduler's CA, the request parsed, the placeholder replaced,
re-sent by the host over its own TLS). For each, over plain HTTP and HTTPS, guest code makes
REQUESTS small requests on one keep-alive connection (after the first: the handshake is timed
apart) and then downloads MB megabytes; the host's own client does the same against the server
directly. Reported: p50/p90 per request, the interception's added p50, and MB/s.

    EXEC_SANDBOX_IMAGES_DIR=... .venv/bin/python bench/net_secrets.py --requests 200 --mb 16
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import http.server
import json
import multiprocessing
import os
import ssl
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from exec_sandbox import Scheduler, SchedulerConfig, Secret

CHUNK = b"x" * 65536


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body are two writes: with Nagle on, delayed ACKs add ~40 ms to every request.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        size = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/bytes/") else 2
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        while size > 0:
            self.wfile.write(CHUNK[: min(size, len(CHUNK))])
            size -= len(CHUNK)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(ready: Connection, crt: str, key: str) -> None:
    import threading

    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    secure = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for server in (plain, secure):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ready.send((plain.server_address[1], secure.server_address[1]))
    ready.recv()


def _make_ca(directory: Path) -> tuple[Path, Path, Path]:
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    ca_key, ca, key, csr, crt = (directory / n for n in ("ca.key", "ca.crt", "k", "csr", "crt"))
    (directory / "ext").write_text("subjectAltName=DNS:relay.test,DNS:secret.test\n")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=bench CA",
        "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=relay.test", "-keyout", str(key),
        "-out", str(csr))  # fmt: skip
    ext = str(directory / "ext")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", str(crt))  # fmt: skip
    return ca, crt, key


# Guest code: REQUESTS requests on one connection, then a MB-megabyte download.
_GUEST = r"""
import http.client, json, os, time
out = {}
for scheme in ("http", "https"):
    for host in ("relay.test", "secret.test"):
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = cls(host, timeout=120)
        headers = {"Authorization": "Bearer " + os.environ["TOKEN"]}
        t = time.perf_counter()
        conn.request("GET", "/", headers=headers); conn.getresponse().read()
        first = time.perf_counter() - t
        times = []
        for _ in range(REQUESTS):
            t = time.perf_counter()
            conn.request("GET", "/", headers=headers); conn.getresponse().read()
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        conn.request("GET", "/bytes/" + str(MB << 20), headers=headers)
        r = conn.getresponse()
        got = 0
        while chunk := r.read(65536):
            got += len(chunk)
        seconds = time.perf_counter() - t
        conn.close()
        out[f"{scheme} {host}"] = {"first": first, "times": times, "mbps": got / seconds / 1e6}
print(json.dumps(out))
"""


def _host_client(
    port: int, tls: ssl.SSLContext | None, requests: int, mb: int
) -> dict[str, object]:
    if tls is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port)
    else:  # by address: the certificate's names are the test names
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls)
    conn.request("GET", "/")
    conn.getresponse().read()
    times = []
    for _ in range(requests):
        t = time.perf_counter()
        conn.request("GET", "/")
        conn.getresponse().read()
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    conn.request("GET", f"/bytes/{mb << 20}")
    got = len(conn.getresponse().read())
    return {"times": times, "mbps": got / (time.perf_counter() - t) / 1e6}


def _pct(times: list[float], q: float) -> float:
    return sorted(times)[min(len(times) - 1, int(q * len(times)))] * 1000


async def main(requests: int, mb: int) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="bench-secrets-"))
    ca, crt, key = _make_ca(work)
    os.environ["SSL_CERT_FILE"] = str(ca)  # the host trusts the bench server (as for any client)
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.Process(target=_serve, args=(child, str(crt), str(key)), daemon=True)
    server.start()
    http_port, https_port = parent.recv()
    hosts = {}
    for name in ("relay.test", "secret.test"):
        hosts[f"{name}:80"] = f"127.0.0.1:{http_port}"
        hosts[f"{name}:443"] = f"127.0.0.1:{https_port}"
    config = SchedulerConfig(
        max_concurrent_vms=1,
        network_test_hosts=hosts,
        network_ca_bundle=ca,  # the relay's TLS ends at the server: the guest trusts its CA
        memory_snapshots=False,
    )
    try:
        async with Scheduler(config) as scheduler:
            code = _GUEST.replace("REQUESTS", str(requests)).replace("MB", str(mb))
            result = await scheduler.run(
                code,
                allow_network=True,
                allowed_domains=["relay.test", "secret.test"],
                secrets=[Secret("TOKEN", "bench-token", hosts=["secret.test"])],
                memory_mb=512,
                timeout_seconds=900,
            )
            if result.exit_code != 0:
                raise RuntimeError(result.stderr)
            guest = json.loads(result.stdout)
        tls = ssl.create_default_context(cafile=str(ca))
        tls.check_hostname = False
        host = {
            "http": _host_client(http_port, None, requests, mb),
            "https": _host_client(https_port, tls, requests, mb),
        }
    finally:
        parent.send("stop")
        server.join(5)
    report: dict[str, object] = {}
    for scheme in ("http", "https"):
        relay = guest[f"{scheme} relay.test"]
        secret = guest[f"{scheme} secret.test"]
        own = host[scheme]
        report[scheme] = {
            "p50_ms": {
                "host_client": round(_pct(own["times"], 0.5), 3),  # type: ignore[arg-type]
                "relay": round(_pct(relay["times"], 0.5), 3),
                "interception": round(_pct(secret["times"], 0.5), 3),
            },
            "p90_ms": {
                "relay": round(_pct(relay["times"], 0.9), 3),
                "interception": round(_pct(secret["times"], 0.9), 3),
            },
            "added_p50_ms": round(_pct(secret["times"], 0.5) - _pct(relay["times"], 0.5), 3),
            "first_request_ms": {
                "relay": round(relay["first"] * 1000, 1),
                "interception": round(secret["first"] * 1000, 1),
            },
            "download_MBps": {
                "host_client": round(own["mbps"], 1),  # type: ignore[call-overload]
                "relay": round(relay["mbps"], 1),
                "interception": round(secret["mbps"], 1),
            },
            "throughput_ratio": round(secret["mbps"] / relay["mbps"], 2),
        }
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--mb", type=int, default=16)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.requests, args.mb)), indent=2))
    sys.exit(0)
