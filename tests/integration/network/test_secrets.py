"""Secrets that never enter the VM (docs/design.md, "Secrets"), with real VMs: the loopback
servers below record what reaches them; the guest's code only ever holds a placeholder."""

from __future__ import annotations

import base64
import http.server
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exec_sandbox import Scheduler, Secret
from exec_sandbox.network import intercept
from tests.helpers import open_fds, private_config, qemu_processes

from .conftest import _make_ca

VALUE = "s3cr3t-value-never-in-the-vm-9f8e7d"
SSE_GAP_SECONDS = 2.0
BLOCK = b"x" * 65536


@dataclass
class Seen:
    """What the recording servers received: (Host header, path, headers, body) per request."""

    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Seen
    root: Path  # /repo/... is served from here, to the secret's Basic credentials only

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.path == "/upload":  # counted, not kept: the test watches this process's memory
            left = length
            while left > 0:
                left -= len(self.rfile.read(min(left, 1 << 16)))
            self._reply(str(length).encode())
            return
        if self.path.startswith("/big/"):
            size = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            while size > 0:
                self.wfile.write(BLOCK[: min(size, len(BLOCK))])
                size -= len(BLOCK)
            return
        body = self.rfile.read(length) if length else b""
        with self.seen.lock:
            self.seen.requests.append(
                (self.headers.get("Host", ""), self.path, dict(self.headers.items()), body)
            )
        if self.path.startswith("/repo/"):
            self._repo_file()
            return
        if self.path == "/ws" and self.headers.get("Upgrade") == "websocket":
            # A protocol switch, then an echo of raw bytes (what follows a 101 is not HTTP).
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            while data := self.rfile.read1(65536):  # type: ignore[attr-defined]
                self.wfile.write(data)
                self.wfile.flush()
            return
        if self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(2):
                event = f"data: {i}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(SSE_GAP_SECONDS)
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/chunks"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                part = f"chunk{i}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        self._reply(b"ok\n")

    def _reply(self, reply: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def _repo_file(self) -> None:
        expected = "Basic " + base64.b64encode(f"x:{VALUE}".encode()).decode()
        path = self.root / self.path.split("?", 1)[0][len("/repo/") :]
        if self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="repo"')
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif not path.resolve().is_relative_to(self.root) or not path.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Recorders:
    seen: Seen
    http_port: int
    https_port: int
    ca_file: Path
    root: Path


def _bare_repo(directory: Path) -> Path:
    """A bare git repository with one commit, ready for the dumb HTTP protocol."""
    work, repo = directory / "work", directory / "repo"
    work.mkdir()
    git = lambda *a, cwd=work: subprocess.run(  # noqa: E731
        ["git", *a], cwd=cwd, check=True, capture_output=True
    )
    git("init", "-q")
    (work / "README").write_text("private repository\n")
    git("add", "README")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    git("clone", "-q", "--bare", str(work), str(repo), cwd=directory)
    git("update-server-info", cwd=repo)
    return repo


@pytest.fixture(scope="module")
def recorders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorders]:
    seen = Seen()
    root = _bare_repo(tmp_path_factory.mktemp("repo")).resolve()
    handler = type("Handler", (_Recorder,), {"seen": seen, "root": root})
    ca, crt, key = _make_ca(tmp_path_factory.mktemp("secrets-ca"))
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    secure = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (plain, secure)]
    for t in threads:
        t.start()
    yield Recorders(seen, plain.server_address[1], secure.server_address[1], ca, root)
    for s in (plain, secure):
        s.shutdown()
        s.server_close()


@pytest.fixture
async def sec_scheduler(
    images_ready: None, recorders: Recorders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Scheduler]:
    """web.test and other.web.test (80, 443) go to the recorders. The host verifies the
    recorders' test CA through SSL_CERT_FILE (the standard variable its trust store honours);
    the guest is never given that CA: it trusts the scheduler's interception CA only."""
    monkeypatch.setenv("SSL_CERT_FILE", str(recorders.ca_file))
    recorders.seen.requests.clear()
    fds_before = open_fds()
    hosts = {}
    for name in ("web.test", "other.web.test"):
        hosts[f"{name}:80"] = f"127.0.0.1:{recorders.http_port}"
        hosts[f"{name}:443"] = f"127.0.0.1:{recorders.https_port}"
    config = private_config(tmp_path, network_test_hosts=hosts)
    async with Scheduler(config) as sched:
        yield sched
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"
    leaked = {fd for fd in open_fds() - fds_before if not fd.startswith("anon_inode:[event")}
    assert not leaked, f"fds outlived the Scheduler: {leaked}"


# Guest code: requests with the placeholder, then everything of the guest's processes'
# environments, hex-encoded, for the host to search for the value.
_CLIENT = r"""
import base64, os, glob, urllib.request
ph = os.environ["API_KEY"]
print("PLACEHOLDER", ph)
def get(url, headers, data=None):
    req = urllib.request.Request(url, headers=headers, data=data)
    with urllib.request.urlopen(req, timeout=30) as r:
        print("GOT", url, r.status, r.read().decode().strip())
scheme = SCHEME
get(scheme + "://web.test/bearer", {"Authorization": "Bearer " + ph})
basic = base64.b64encode(("user:" + ph).encode()).decode()
get(scheme + "://web.test/basic", {"Authorization": "Basic " + basic})
get(scheme + "://web.test/body", {"X-Id": "1"}, data=ph.encode())
get(scheme + "://other.web.test/elsewhere", {"Authorization": "Bearer " + ph})
env = b""
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        env += open(path, "rb").read()
    except OSError:
        pass
print("ENVHEX", env.hex())
"""


def _by_path(seen: Seen, path: str) -> tuple[str, dict[str, str], bytes]:
    for host, got_path, headers, body in seen.requests:
        if got_path == path:
            return host, headers, body
    raise AssertionError(f"the server saw no request for {path}: {seen.requests}")


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_placeholder_replaced_only_for_the_secrets_host(
    sec_scheduler: Scheduler, recorders: Recorders, scheme: str
) -> None:
    secret = Secret("API_KEY", VALUE, hosts=["web.test"])
    result = await sec_scheduler.run(
        _CLIENT.replace("SCHEME", repr(scheme)),
        allow_network=True,
        allowed_domains=["web.test"],
        secrets=[secret],
        http_headers={"web.test": {"X-Rule": "from-the-host"}},
    )
    assert result.exit_code == 0, result.stderr
    placeholder = result.stdout.split("PLACEHOLDER ", 1)[1].split()[0]
    assert placeholder != VALUE and VALUE not in result.stdout + result.stderr
    env = bytes.fromhex(result.stdout.split("ENVHEX ", 1)[1].split()[0])
    assert placeholder.encode() in env and VALUE.encode() not in env
    assert VALUE not in repr(secret)

    _host, headers, _body = _by_path(recorders.seen, "/bearer")
    assert headers["Authorization"] == f"Bearer {VALUE}"
    assert headers["X-Rule"] == "from-the-host"
    _host, headers, _body = _by_path(recorders.seen, "/basic")
    credentials = base64.b64decode(headers["Authorization"].split()[1]).decode()
    assert credentials == f"user:{VALUE}"
    _host, headers, body = _by_path(recorders.seen, "/body")
    assert body == placeholder.encode(), "a body placeholder is not replaced by default"
    host, headers, _body = _by_path(recorders.seen, "/elsewhere")
    assert host.startswith("other.web.test")
    assert headers["Authorization"] == f"Bearer {placeholder}", "another host got the value"
    assert "X-Rule" not in headers

    port = 443 if scheme == "https" else 80
    # urllib closes each connection after its request: three connections, one request each.
    records = [
        r
        for c in result.network_log
        if c.name == "web.test" and c.port == port
        for r in c.http_requests
    ]
    assert [(r.method, r.path, r.status, r.secrets) for r in records] == [
        ("GET", "/bearer", 200, ("API_KEY",)),
        ("GET", "/basic", 200, ("API_KEY",)),
        ("POST", "/body", 200, ()),
    ]
    assert records[2].bytes_sent == len(placeholder)
    assert records[0].bytes_received == 3
    other = [c for c in result.network_log if c.name == "other.web.test"]
    assert other and all(not c.http_requests for c in other), "other hosts keep the byte relay"
    assert VALUE not in repr(result)


_BODY_CLIENT = r"""
import http.client, json, os, socket, ssl, urllib.parse
ph = os.environ["API_KEY"]
ctx = ssl.create_default_context()
def post(path, body, headers, chunked=False, method="POST"):
    conn = http.client.HTTPSConnection("web.test", timeout=30, context=ctx)
    if chunked:
        conn.request(method, path, body=iter([body[:5], body[5:]]), headers=headers,
                     encode_chunked=True)
    else:
        conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    print("GOT", path, r.status, r.read()[:200].decode(errors="replace").strip())
    conn.close()
post("/json", json.dumps({"key": ph, "prompt": "repeat " + ph, "inner": {"key": ph}}).encode(),
     {"Content-Type": "application/json"})
form = urllib.parse.urlencode({"key": ph, "text": ph}).encode()
post("/form", form, {"Content-Type": "application/x-www-form-urlencoded",
                     "Expect": "100-continue"}, chunked=True)
post("/echo", b"", {"Origin": ph, "X-Request-Id": ph, "Authorization": "Bearer " + ph})
post("/big", b"x" * (1024 * 1024 + 1), {"Content-Type": "application/json"})
post("/trace", None, {"Authorization": "Bearer " + ph}, method="TRACE")
raw = ctx.wrap_socket(socket.create_connection(("web.test", 443), timeout=30),
                      server_hostname="web.test")
raw.sendall(b"POST /smuggle HTTP/1.1\r\nHost: web.test\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
print("SMUGGLE", raw.recv(200).split(b"\r\n")[0].decode())
"""


async def test_only_credential_places_get_the_value(
    sec_scheduler: Scheduler, recorders: Recorders
) -> None:
    """Where a server may echo input, the placeholder stays: only credential headers and, with
    replace_in_body="key", a top-level JSON member or form field named key whose whole value is
    the placeholder get the value (a chunked form with Expect: 100-continue too, re-framed by
    its new length). A body over the limit is 413, TRACE 405, Content-Length beside
    Transfer-Encoding 400, none of them reaching the server."""
    result = await sec_scheduler.run(
        _BODY_CLIENT,
        allow_network=True,
        allowed_domains=["web.test"],
        secrets=[Secret("API_KEY", VALUE, hosts=["web.test"], replace_in_body="key")],
    )
    assert result.exit_code == 0, result.stderr
    assert VALUE not in result.stdout + result.stderr
    placeholder = "sbx-secret-"
    _host, headers, body = _by_path(recorders.seen, "/json")
    document = json.loads(body)
    assert document["key"] == VALUE
    assert document["prompt"].startswith("repeat " + placeholder)
    assert document["inner"]["key"].startswith(placeholder)
    lower = {k.lower(): v for k, v in headers.items()}
    assert lower["content-length"] == str(len(body))
    _host, headers, body = _by_path(recorders.seen, "/form")
    form = dict(urllib.parse.parse_qsl(body.decode()))
    assert form["key"] == VALUE and form["text"].startswith(placeholder)
    lower = {k.lower(): v for k, v in headers.items()}
    assert "transfer-encoding" not in lower and "expect" not in lower
    _host, headers, _body = _by_path(recorders.seen, "/echo")
    lower = {k.lower(): v for k, v in headers.items()}
    assert lower["authorization"] == f"Bearer {VALUE}"
    assert lower["origin"].startswith(placeholder) and lower["x-request-id"].startswith(placeholder)
    assert "GOT /big 413" in result.stdout, result.stdout
    assert "GOT /trace 405" in result.stdout, result.stdout
    assert "SMUGGLE HTTP/1.1 400" in result.stdout, result.stdout
    reached = {path for _h, path, _hd, _b in recorders.seen.requests}
    assert not reached & {"/big", "/trace", "/smuggle"}
    records = [r for c in result.network_log for r in c.http_requests]
    assert [(r.path, r.status, r.secrets) for r in records][:3] == [
        ("/json", 200, ("API_KEY",)),
        ("/form", 200, ("API_KEY",)),
        ("/echo", 200, ("API_KEY",)),
    ]


async def test_session_header_rule_chunked_and_bad_upstream_certificate(
    sec_scheduler: Scheduler, recorders: Recorders, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header rule with no env var, a chunked response streamed through with curl over
    TLS, keep-alive; then a real host whose certificate the host cannot verify: a 502."""
    async with await sec_scheduler.session(
        language="raw",
        allow_network=True,
        allowed_domains=["web.test"],
        http_headers={"web.test": {"X-Api-Key": VALUE}},
    ) as session:
        result = await session.exec(
            "curl -sS --fail https://web.test/chunks https://web.test/again; "
            "env | grep -c s3cr3t || true"
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.startswith("chunk0\nchunk1\nchunk2\nok\n"), result.stdout
        assert result.stdout.strip().endswith("0")
        _host, headers, _body = _by_path(recorders.seen, "/again")
        assert headers["X-Api-Key"] == VALUE
        [conn] = [c for c in session.network_log if c.name == "web.test"]
        assert [r.path for r in conn.http_requests] == ["/chunks", "/again"]  # one connection

        monkeypatch.delenv("SSL_CERT_FILE")  # the host no longer trusts the recorders' CA
        sec_scheduler._hub()._upstream_tls = None  # type: ignore[attr-defined]  # read again
        result = await session.exec("curl -sS -w '%{http_code}' https://web.test/x")
        assert result.stdout.startswith("web.test: the real host's certificate"), result.stdout
        assert result.stdout.endswith("502")
        errors = [r.error for c in session.network_log for r in c.http_requests if r.error]
        assert any("certificate" in e for e in errors)


_HOSTILE = r"""
import os, socket, time
key = os.environ["API_KEY"].encode()
def talk(payload, slow=False):
    s = socket.create_connection(("web.test", 80), timeout=20)
    try:
        if slow:  # until the host gives up on it (its answer is read below)
            try:
                for b in payload:
                    s.sendall(bytes([b]))
                    time.sleep(0.5)
            except OSError:
                pass
        else:
            s.sendall(payload)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.split(b"\r\n", 1)[0].decode()
    except OSError as exc:
        return "error " + type(exc).__name__
    finally:
        s.close()
print("MANY", talk(b"GET / HTTP/1.1\r\nHost: web.test\r\n" + b"X: y\r\n" * 10000 + b"\r\n"))
print("BIG", talk(b"GET / HTTP/1.1\r\nHost: web.test\r\nX: " + b"a" * 200000 + b"\r\n\r\n"))
print("BAD", talk(b"GARBAGE\x00 / HTTP/9\r\n\r\n"))
print("VHOST", talk(b"GET / HTTP/1.1\r\nHost: other.web.test\r\nX-K: " + key + b"\r\n\r\n"))
print("ABSOLUTE", talk(b"GET http://other.web.test/ HTTP/1.1\r\nHost: web.test\r\n\r\n"))
started = time.monotonic()
print("SLOW", talk(b"GET / HTTP/1.1\r\nHost: web.test\r\n" + b"X-Slow: 1\r\n" * 20, slow=True))
print("SLOWSECONDS", round(time.monotonic() - started))
s = socket.create_connection(("web.test", 80), timeout=60)
s.sendall(b"GET /p HTTP/1.1\r\nHost: web.test\r\n\r\n" * 499
          + b"GET /p HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
flood = b""
while chunk := s.recv(65536):
    flood += chunk
print("PIPELINED", flood.count(b"HTTP/1.1 200"))
s = socket.create_connection(("web.test", 80), timeout=20)
s.sendall(b"GET /after HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
print("AFTER", s.recv(100).split(b"\r\n", 1)[0].decode())
"""


async def test_hostile_requests_are_refused(
    sec_scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10,000 headers, one 200 kB header, a malformed request line, a slowloris head: each
    answered with a 4xx and closed; 500 pipelined requests in one write answered in turn (read
    one at a time: what waits stays in the socket); a normal request afterwards still works."""
    monkeypatch.setattr(intercept, "HEAD_TIMEOUT_SECONDS", 3.0)
    result = await sec_scheduler.run(
        _HOSTILE,
        allow_network=True,
        allowed_domains=["web.test"],
        secrets=[Secret("API_KEY", VALUE, hosts=["web.test"])],
        timeout_seconds=120,
    )
    assert result.exit_code == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["MANY"].split()[1] == "431", lines
    assert lines["BIG"].split()[1] == "431", lines
    assert lines["BAD"].split()[1] == "400", lines
    # Another site behind the same address would get the value: refused.
    assert lines["VHOST"].split()[1] == "421", lines
    assert lines["ABSOLUTE"].split()[1] == "400", lines
    assert lines["SLOW"].split()[1] == "408", lines
    assert int(lines["SLOWSECONDS"]) < 30, "the slow head was not cut off"
    assert lines["PIPELINED"] == "500", "pipelined requests are answered in turn"
    assert lines["AFTER"].startswith("HTTP/1.1 200"), lines
    assert json.dumps([c.reason for c in result.network_log])  # log readable


_CLIENTS = r"""
import os, socket, ssl, subprocess, time, http.client
token = os.environ["GIT_TOKEN"]
clone = subprocess.run(["git", "clone", "-q", f"https://x:{token}@web.test/repo/", "/tmp/r"],
                       capture_output=True, text=True)
print("CLONE", clone.returncode, open("/tmp/r/README").read().strip() if clone.returncode == 0
      else clone.stderr.replace(chr(10), " "))
raw = ssl.create_default_context().wrap_socket(
    socket.create_connection(("web.test", 443), timeout=30), server_hostname="web.test")
raw.sendall(b"GET /ws HTTP/1.1\r\nHost: web.test\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += raw.recv(1)
raw.sendall(b"ping-after-upgrade")
echo = b""
while len(echo) < 18:
    echo += raw.recv(100)
print("WS", head.split(b"\r\n")[0].decode(), echo.decode())
raw.close()
conn = http.client.HTTPSConnection("web.test", timeout=30)
started = time.monotonic()
conn.request("GET", "/sse")
response = conn.getresponse()
times = []
while line := response.readline():
    if line.startswith(b"data:"):
        times.append(time.monotonic() - started)
print("SSE", " ".join(f"{t:.3f}" for t in times))
"""


async def test_git_clone_websocket_and_sse_through_the_interception(
    sec_scheduler: Scheduler, recorders: Recorders
) -> None:
    """git clone over HTTPS with the placeholder as its Basic password (the server answers 401
    to anything but the real value); a 101 upgrade then bytes both ways; an event stream whose
    first event reaches the guest's code before the server sends the second."""
    result = await sec_scheduler.run(
        _CLIENTS,
        allow_network=True,
        allowed_domains=["web.test"],
        secrets=[Secret("GIT_TOKEN", VALUE, hosts=["web.test"])],
        timeout_seconds=240,
    )
    assert result.exit_code == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["CLONE"] == "0 private repository", lines
    assert lines["WS"] == "HTTP/1.1 101 Switching Protocols ping-after-upgrade", lines
    first, second = (float(t) for t in lines["SSE"].split())
    assert second - first > SSE_GAP_SECONDS / 2, "the first event waited for the second"
    print(f"SSE first event after {first * 1000:.0f} ms (measured in the guest)")
    records = [r for c in result.network_log for r in c.http_requests]
    assert any(r.path.startswith("/repo/") and r.status == 200 for r in records)
    assert any(r.path == "/ws" and r.status == 101 for r in records)
    assert VALUE not in result.stdout + result.stderr


_BULK = r"""
import os, http.client
MB = 100 << 20
conn = http.client.HTTPConnection("web.test", timeout=600)
conn.request("GET", "/big/%d" % MB, headers={"Authorization": os.environ["API_KEY"]})
r = conn.getresponse()
got = 0
while chunk := r.read(1 << 16):
    got += len(chunk)
print("DOWN", got)
def body():
    block = b"y" * (1 << 16)
    for _ in range(MB >> 16):
        yield block
conn.request("POST", "/upload", body=body(),
             headers={"Content-Length": str(MB), "Authorization": os.environ["API_KEY"]})
print("UP", conn.getresponse().read().decode())
"""


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_100_mb_each_way_with_bounded_host_memory(sec_scheduler: Scheduler) -> None:
    """100 MB down and 100 MB up through the interception on one keep-alive connection; the
    host process's resident memory (sampled while they run) grows by far less than that."""
    before = _rss_mb()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, _rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = await sec_scheduler.run(
            _BULK,
            allow_network=True,
            allowed_domains=["web.test"],
            secrets=[Secret("API_KEY", VALUE, hosts=["web.test"])],
            timeout_seconds=600,
        )
    finally:
        done.set()
        sampler.join()
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["DOWN", str(100 << 20), "UP", str(100 << 20)]
    [conn] = [c for c in result.network_log if c.name == "web.test"]
    assert [(r.bytes_received, r.bytes_sent) for r in conn.http_requests] == [
        (100 << 20, 0),
        (len(str(100 << 20)), 100 << 20),
    ]
    print(f"host RSS {before:.0f} MB before, {peak:.0f} MB at most during 2 x 100 MB")
    assert peak - before < 40, f"the host's memory grew by {peak - before:.0f} MB"


async def test_curl_and_node_with_the_placeholder_then_pause_keeps_no_value(
    sec_scheduler: Scheduler, recorders: Recorders, tmp_path: Path
) -> None:
    """curl and Node's fetch send the env var's placeholder over HTTPS and the server gets the
    value; the session paused to disk: no file of it holds the value, while its memory image
    does hold the placeholder (so the search would have found a value there)."""
    async with await sec_scheduler.session(
        language="raw",
        allow_network=True,
        allowed_domains=["web.test"],
        secrets=[Secret("API_KEY", VALUE, hosts=["web.test"])],
    ) as session:
        result = await session.exec(
            'curl -sS --fail -H "Authorization: Bearer $API_KEY" https://web.test/curl && '
            "node -e \"fetch('https://web.test/node', {headers: {Authorization: 'Bearer ' + "
            'process.env.API_KEY}}).then(r => r.text()).then(t => process.stdout.write(t))" && '
            "echo $API_KEY"
        )
        assert result.exit_code == 0, result.stderr
        placeholder = result.stdout.split()[-1]
        assert result.stdout.split()[:2] == ["ok", "ok"], result.stdout
        for path in ("/curl", "/node"):
            _host, headers, _body = _by_path(recorders.seen, path)
            assert headers["Authorization"] == f"Bearer {VALUE}", path
        snapshot = await session.pause()
    with_value = subprocess.run(
        ["grep", "-rlaF", VALUE, str(tmp_path)], capture_output=True, text=True
    )
    with_placeholder = subprocess.run(
        ["grep", "-rlaF", placeholder, str(tmp_path)], capture_output=True, text=True
    )
    assert with_value.stdout == "", f"the value is in {with_value.stdout}"
    # The memory image, not only the metadata (which keeps the session's env).
    found = with_placeholder.stdout.split()
    assert any(not name.endswith(".json") for name in found), found
    assert str(snapshot)
