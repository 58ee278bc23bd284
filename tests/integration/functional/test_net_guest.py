"""The guest's half of the network in real VMs: the net port, the DNS stub, the
per-address listeners, the stream relay with its credit flow control, NET_CONNECT, the CA bundle.

The host side here is `NetPortStandIn`: a TEST STAND-IN that speaks the frames of
src/shared/net_protocol.h on Vm.net_fd. It is NOT the host's relay (that is the C relay and the
Python policy of the net-host work); it plays a host, including a misbehaving one, so that what the
guest does can be checked frame by frame. NET_CONFIG goes on the agent channel as a raw frame for
the same reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import select
import shutil
import ssl
import struct
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exec_sandbox.images.catalog import load_images
from exec_sandbox.paths import images_dir
from exec_sandbox.vm import host_facts
from exec_sandbox.vm.execution import ExecRequest
from exec_sandbox.vm.guest import GuestVm
from exec_sandbox.vm.spec import VmSpec

pytestmark = pytest.mark.vm

# src/shared/net_protocol.h
OPEN, CONNECTED, REFUSED, OPENED, CONNECT = 48, 49, 50, 112, 113
DATA, CREDIT, SHUTDOWN, CLOSE = 120, 121, 122, 123
NET_CONFIG = 104
OUTBOUND = 1
WINDOW = 1024 * 1024
DATA_MAX = 60 * 1024
OK, REFUSED_POLICY, CONNECT_FAILED = 0, 1, 4
HEADER = struct.Struct("<IBBHI")


def frame(type_: int, id_: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), type_, 0, 0, id_) + payload


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def string(b: bytes) -> bytes:
    return u32(len(b)) + b


def net_config(names: list[str], ports: list[int], ca: bytes = b"", flags: int = OUTBOUND) -> bytes:
    body = u32(flags) + u32(len(names)) + b"".join(string(n.encode()) for n in names)
    body += u32(len(ports)) + b"".join(u32(p) for p in ports)
    return body + string(ca)


class NetPortStandIn:
    """TEST STAND-IN for the host end of the net port (see the module docstring)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.frames: asyncio.Queue[tuple[int, int, bytes]] = asyncio.Queue()
        # NET_REFUSED reports (what, port, count, subject), kept apart from the streams' frames.
        self.refused: list[tuple[int, int, int, bytes]] = []
        self.eof = False
        asyncio.get_running_loop().add_reader(fd, self._readable)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.fd)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.eof = True
            self.close()
            return
        self.buf += data
        while len(self.buf) >= HEADER.size:
            length, type_, flags, reserved, id_ = HEADER.unpack_from(self.buf)
            assert flags == 0 and reserved == 0, "the guest set reserved header bytes"
            assert length <= 64 * 1024, f"guest frame of {length} bytes"
            if len(self.buf) < HEADER.size + length:
                break
            payload = bytes(self.buf[HEADER.size : HEADER.size + length])
            del self.buf[: HEADER.size + length]
            if type_ == REFUSED:
                assert id_ == 0, "NET_REFUSED with a stream id"
                what, port, count, n = struct.unpack_from("<IIII", payload)
                self.refused.append((what, port, count, payload[16 : 16 + n]))
                continue
            self.frames.put_nowait((type_, id_, payload))

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                await asyncio.sleep(0.005)

    async def next(self, timeout: float = 20) -> tuple[int, int, bytes]:
        return await asyncio.wait_for(self.frames.get(), timeout)

    async def expect(self, type_: int, timeout: float = 20) -> tuple[int, bytes]:
        """The next frame other than CREDIT (credits are counted in self.credited)."""
        while True:
            t, id_, payload = await self.next(timeout)
            if t == CREDIT:
                self.credited = getattr(self, "credited", 0) + struct.unpack("<I", payload)[0]
                continue
            assert t == type_, (t, id_, payload[:64])
            return id_, payload


async def send_agent_frame(vm: GuestVm, type_: int, req_id: int, payload: bytes) -> None:
    """A raw frame on the agent channel, answered by PONG or ERROR (NET_CONFIG has no binding on
    this branch: the host relay brings it). Written only while the channel's queue is empty, so
    that it cannot interleave with the Vm's own frames."""
    assert vm._vm.flush() == 0
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    vm._acks[req_id] = done
    data = memoryview(frame(type_, req_id, payload))
    while data:
        try:
            data = data[os.write(vm._vm.channel_fd, data) :]
        except BlockingIOError:
            select.select([], [vm._vm.channel_fd], [], 1)
    try:
        await asyncio.wait_for(done, 20)
    finally:
        vm._acks.pop(req_id, None)


def _spec(net_port: bool) -> VmSpec:
    return VmSpec(
        qemu_binary=host_facts.qemu_binary(),
        images=load_images(images_dir()),
        accel=host_facts.accelerator(),
        memory_mb=256,
        net_port=net_port,
        kernel_cmdline_extra=f"tsc_early_khz={host_facts.tsc_khz()}",
    )


@pytest.fixture
async def net_vm(images_ready: None) -> AsyncIterator[tuple[GuestVm, NetPortStandIn]]:
    vm = await GuestVm.boot(_spec(True), registry=None, boot_timeout=90)
    port = NetPortStandIn(vm._vm.net_fd)
    try:
        yield vm, port
    finally:
        port.close()
        vm.close()


def _py(code: str, timeout_ms: int = 60_000) -> ExecRequest:
    return ExecRequest("python", code.encode(), timeout_ms, [], 1 << 20, 1 << 16)


def _raw(script: str) -> ExecRequest:
    return ExecRequest("raw", script.encode(), 180_000, [], 1 << 16, 1 << 16)


CA = b"-----BEGIN CERTIFICATE-----\nTEST STAND-IN BUNDLE\n-----END CERTIFICATE-----\n"

# A raw DNS query from inside the guest, to see the stub's answer code and record count.
DNS_PROBE = r"""
import socket, struct
def ask(name, qtype):
    q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)
    q += b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0'
    q += struct.pack('>HH', qtype, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, ('127.0.0.53', 53))
    r = s.recv(512)
    flags, qd, an = struct.unpack('>HHH', r[2:8])
    addr = socket.inet_ntoa(r[-4:]) if an else '-'
    return f'{name} {qtype} rcode={flags & 15} an={an} {addr}'
"""


async def test_plain_vm_has_no_net_port_and_refuses_net_config(images_ready: None) -> None:
    vm = await GuestVm.boot(_spec(False), registry=None, boot_timeout=90)
    try:
        assert vm._vm.net_fd == -1
        with pytest.raises(Exception, match="no port org.execsandbox.net.0"):
            await send_agent_frame(vm, NET_CONFIG, 900, net_config(["example.org"], []))
        # Names fail at once (nothing listens at the stub's address), and the image's resolver
        # is the stub, not the build host's.
        r = await vm.execute(
            _py(
                "import socket, time\n"
                "print(open('/etc/resolv.conf').read().split())\n"
                "t = time.monotonic()\n"
                "try:\n    socket.gethostbyname('example.org')\n"
                "except OSError as e:\n    print('failed')\n"
                "print(time.monotonic() - t < 5)\n"
            )
        )
        assert r.stdout.splitlines()[1:] == ["failed", "True"], r
        assert r.stdout.splitlines()[0].startswith("['nameserver', '127.0.0.53'"), r
    finally:
        vm.close()


async def test_dns_stub_listeners_and_a_relayed_stream(
    net_vm: tuple[GuestVm, NetPortStandIn],
) -> None:
    vm, port = net_vm
    await send_agent_frame(vm, NET_CONFIG, 901, net_config(["allowed.test"], [8080], CA))
    big = os.urandom(2 * WINDOW + 300 * 1024)  # more than two windows host -> guest
    code = (
        DNS_PROBE
        + r"""
import errno, hashlib, os
print(ask('allowed.test', 1))
print(ask('API.Allowed.Test', 1))
print(ask('allowed.test', 28))
print(ask('xallowed.test', 1))
print(ask('other.example', 1))
print(socket.gethostbyname('api.allowed.test'))
try:
    socket.create_connection(('93.184.216.34', 80), timeout=5).recv(1)
except OSError as e:
    print('literal', errno.errorcode[e.errno])
# user code keeps 127.0.0.1:8080 although the agent listens on 198.18.0.1:8080
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 8080)); srv.listen(); print('user bind ok')
s = socket.create_connection(('allowed.test', 443), timeout=30)
s.sendall(b'hello from the guest')
s.shutdown(socket.SHUT_WR)
got = b''
while True:
    d = s.recv(1 << 16)
    if not d:
        break
    got += d
print('received', len(got), hashlib.sha256(got).hexdigest())
print(open('/etc/ssl/certs/ca-certificates.crt').read() == open(os.environ['SSL_CERT_FILE']).read())
print(os.environ['SSL_CERT_FILE'], os.environ['REQUESTS_CA_BUNDLE'], os.environ['PIP_CERT'])
print(os.environ['NODE_EXTRA_CA_CERTS'])
print(open('/run/sbx/ca-certificates.crt').read() == open(os.environ['NODE_EXTRA_CA_CERTS']).read())
print(repr(open('/etc/ssl/certs/ca-certificates.crt').read()))
"""
    )
    run = asyncio.create_task(vm.execute(_py(code)))
    sid, payload = await port.expect(OPEN, timeout=60)
    assert 1 <= sid < 0x80000000
    assert payload == u32(443) + string(b"allowed.test")
    await port.send(frame(OPENED, sid, u32(OK) + string(b"")))
    got = b""
    while True:
        t, id_, data = await port.next()
        assert id_ == sid and t in (DATA, SHUTDOWN), (t, id_)
        if t == SHUTDOWN:
            break
        got += data
    assert got == b"hello from the guest"
    await port.send(frame(CREDIT, sid, u32(len(got))))
    # Host -> guest: never more than the window uncredited; the guest credits what it wrote.
    port.credited = 0
    sent = 0
    while sent < len(big):
        while sent - port.credited >= WINDOW - DATA_MAX:
            t, id_, p = await port.next()
            assert (t, id_) == (CREDIT, sid), (t, id_)
            port.credited += struct.unpack("<I", p)[0]
        chunk = big[sent : sent + DATA_MAX]
        await port.send(frame(DATA, sid, chunk))
        sent += len(chunk)
    await port.send(frame(SHUTDOWN, sid))
    # Both sides shut and everything written: the guest closes cleanly; the host answers.
    while True:
        t, id_, p = await port.next()
        if t == CREDIT:
            port.credited += struct.unpack("<I", p)[0]
            continue
        assert (t, id_, p) == (CLOSE, sid, u32(0))
        break
    assert port.credited == len(big)  # every byte credited back, none twice
    await port.send(frame(CLOSE, sid, u32(0)))
    r = await run
    lines = r.stdout.splitlines()
    assert lines[0] == "allowed.test 1 rcode=0 an=1 198.18.0.1", r
    assert lines[1] == "API.Allowed.Test 1 rcode=0 an=1 198.18.0.2"  # a subdomain: a new address
    assert lines[2] == "allowed.test 28 rcode=0 an=0 -"  # AAAA: empty NOERROR
    assert lines[3] == "xallowed.test 1 rcode=3 an=0 -"  # not under the allowed name
    assert lines[4] == "other.example 1 rcode=3 an=0 -"
    assert lines[5] == "198.18.0.2"  # case-blind and stable: the same name, the same address
    # Every IPv4 address is the guest's own: the catch-all on 80 takes it and resets it.
    assert lines[6] == "literal ECONNRESET"
    # The refusals the guest made itself, reported: two names, the literal (A-record asks only).
    assert port.refused == [
        (0, 0, 1, b"xallowed.test"),
        (0, 0, 1, b"other.example"),
        (1, 80, 1, b"93.184.216.34"),
    ], port.refused
    assert lines[7] == "user bind ok"
    assert lines[8] == f"received {len(big)} {hashlib.sha256(big).hexdigest()}"
    assert lines[9] == "True"
    assert lines[10] == "/run/sbx/ca-certificates.crt " * 2 + "/run/sbx/ca-certificates.crt"
    assert lines[11] == "/run/sbx/extra-ca-certificates.crt"
    assert lines[12] == "True"
    assert lines[13] == repr(CA.decode())  # the system bundle is the host's now


async def test_refused_open_resets_the_client(net_vm: tuple[GuestVm, NetPortStandIn]) -> None:
    vm, port = net_vm
    await send_agent_frame(vm, NET_CONFIG, 902, net_config(["*"], []))
    code = (
        "import socket, errno\n"
        "try:\n"
        "    s = socket.create_connection(('anything.example', 80), timeout=30)\n"
        "    print('recv', s.recv(10))\n"
        "except OSError as e:\n"
        "    print('error', errno.errorcode.get(e.errno))\n"
    )
    run = asyncio.create_task(vm.execute(_py(code)))
    sid, payload = await port.expect(OPEN, timeout=60)
    assert payload == u32(80) + string(b"anything.example")
    await port.send(frame(OPENED, sid, u32(REFUSED_POLICY) + string(b"not allowed")))
    r = await run
    assert r.stdout.strip() in ("error ECONNRESET", "recv b''"), r
    # No CLOSE follows a refused open, and the id is free: nothing more on the port.
    with pytest.raises(asyncio.TimeoutError):
        await port.next(timeout=1)


async def test_net_connect_reaches_a_guest_http_server(
    net_vm: tuple[GuestVm, NetPortStandIn],
) -> None:
    vm, port = net_vm
    await send_agent_frame(vm, NET_CONFIG, 903, net_config([], [], flags=0))  # ports only
    hid = 0x80000001
    # Nothing listens yet: refused cleanly, and the id is free again at once.
    await port.send(frame(CONNECT, hid, u32(8000)))
    id_, payload = await port.expect(CONNECTED)
    assert (id_, payload) == (hid, u32(CONNECT_FAILED))
    server = (
        "import http.server, os\n"
        "os.chdir('/tmp'); open('hello.txt', 'w').write('served from the guest')\n"
        "s = http.server.HTTPServer(('127.0.0.1', 8000),\n"
        "                           http.server.SimpleHTTPRequestHandler)\n"
        "s.handle_request()\n"
    )
    run = asyncio.create_task(vm.execute(_py(server)))
    for _ in range(200):
        await port.send(frame(CONNECT, hid, u32(8000)))
        id_, payload = await port.expect(CONNECTED)
        assert id_ == hid
        if payload == u32(OK):
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the guest server never accepted")
    await port.send(frame(DATA, hid, b"GET /hello.txt HTTP/1.0\r\n\r\n"))
    await port.send(frame(SHUTDOWN, hid))
    body = b""
    while True:
        t, id_, p = await port.next()
        assert id_ == hid
        if t == DATA:
            body += p
            await port.send(frame(CREDIT, hid, u32(len(p))))
        elif t == CLOSE:
            assert p == u32(0)
            break
        else:
            assert t in (CREDIT, SHUTDOWN), t
    await port.send(frame(CLOSE, hid, u32(0)))
    assert body.startswith(b"HTTP/1.0 200"), body[:100]
    assert body.endswith(b"served from the guest")
    await run


async def test_a_host_that_overruns_the_window_costs_the_stream_not_the_vm(
    net_vm: tuple[GuestVm, NetPortStandIn],
) -> None:
    vm, port = net_vm
    await send_agent_frame(vm, NET_CONFIG, 904, net_config(["allowed.test"], []))
    code = (
        "import socket, time, errno\n"
        "s = socket.create_connection(('allowed.test', 80), timeout=30)\n"
        "time.sleep(3)\n"
        "try:\n"
        "    n = 0\n"
        "    while d := s.recv(1 << 16):\n"
        "        n += len(d)\n"
        "    print('eof after', n)\n"
        "except OSError as e:\n"
        "    print('error', errno.errorcode.get(e.errno))\n"
    )
    run = asyncio.create_task(vm.execute(_py(code)))
    sid, _ = await port.expect(OPEN, timeout=60)
    await port.send(frame(OPENED, sid, u32(OK) + string(b"")))
    # Data without waiting for credit: once the guest's socket is full (the code does not read),
    # what the guest has not credited reaches the window, and the next byte breaks it.
    chunk = b"x" * DATA_MAX
    closed = None
    for _ in range(80):
        await port.send(frame(DATA, sid, chunk))
        while not port.frames.empty():
            t, id_, p = port.frames.get_nowait()
            assert id_ == sid and t in (CREDIT, CLOSE), t
            if t == CLOSE:
                closed = p
        if closed is not None:
            break
    while closed is None:
        t, id_, p = await port.next()
        assert id_ == sid and t in (CREDIT, CLOSE), t
        closed = p if t == CLOSE else None
    assert closed == u32(1)  # reset
    await port.send(frame(CLOSE, sid, u32(1)))
    r = await run
    assert r.stdout.strip() in ("error ECONNRESET",) or r.stdout.startswith("eof after"), r
    # Broken framing on the net port costs the port; the agent still serves its channel.
    await port.send(HEADER.pack(4, DATA, 1, 0, 5) + b"oops")
    await vm.ping()
    assert (await vm.execute(_py("print(6 * 7)"))).stdout == "42\n"


async def serve_http(port: NetPortStandIn, streams: int) -> list[tuple[int, bytes]]:
    """The stand-in as an HTTP server behind every OPEN: answers each request with its path,
    then half-closes; returns (port, request) per stream."""
    state: dict[int, dict[str, object]] = {}
    seen: list[tuple[int, bytes]] = []
    done = 0
    while done < streams:
        t, sid, p = await port.next(timeout=60)
        if t == OPEN:
            (dport,) = struct.unpack_from("<I", p)
            state[sid] = {"req": b"", "port": dport, "answered": False}
            await port.send(frame(OPENED, sid, u32(OK) + string(b"")))
        elif t == DATA:
            st = state[sid]
            st["req"] = req = st["req"] + p  # type: ignore[operator]
            await port.send(frame(CREDIT, sid, u32(len(p))))
            if b"\r\n\r\n" in req and not st["answered"]:
                path = req.split(b" ", 2)[1]
                body = b"hello " + path
                head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                await port.send(frame(DATA, sid, head % len(body) + body))
                await port.send(frame(SHUTDOWN, sid))
                st["answered"] = True
                seen.append((st["port"], req))  # type: ignore[arg-type]
        elif t == CLOSE:
            await port.send(frame(CLOSE, sid, u32(0)))
            done += 1
        else:
            assert t in (CREDIT, SHUTDOWN), t
    return seen


async def test_real_clients_resolve_and_connect_through_the_stub(
    net_vm: tuple[GuestVm, NetPortStandIn],
) -> None:
    vm, port = net_vm
    await send_agent_frame(vm, NET_CONFIG, 905, net_config(["allowed.test"], [8080]))
    script = (
        "curl -sS --max-time 30 http://allowed.test/curl; echo\n"
        "curl -sS --max-time 30 http://api.allowed.test:8080/extra-port; echo\n"
        'python3 -c "import urllib.request as u; '
        "print(u.urlopen('http://allowed.test/urllib', timeout=30).read().decode())\"\n"
        "node -e \"fetch('http://allowed.test/node').then(r => r.text()).then(console.log)\""
        " 2>/dev/null\n"
        "curl -sS --max-time 5 http://refused.example/ 2>&1 | head -c 60; echo\n"
    )
    run = asyncio.create_task(vm.execute(_raw(script)))
    seen = await serve_http(port, 4)
    r = await run
    assert r.stdout.splitlines()[:4] == [
        "hello /curl",
        "hello /extra-port",
        "hello /urllib",
        "hello /node",
    ], r
    assert "Could not resolve host: refused.example" in r.stdout.splitlines()[4], r
    assert [p for p, _ in seen] == [80, 8080, 80, 80]
    assert b"Host: api.allowed.test:8080" in seen[1][1]


def make_test_ca(d: Path) -> tuple[bytes, ssl.SSLContext]:
    """A throwaway CA and a server context with a certificate for allowed.test signed by it:
    (CA PEM, context)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            *ec,
            "-keyout",
            d / "ca.key",
            "-out",
            d / "ca.pem",
            "-subj",
            "/CN=exec-sandbox test CA",
            "-days",
            "1",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            "openssl",
            "req",
            *ec,
            "-keyout",
            d / "leaf.key",
            "-out",
            d / "leaf.csr",
            "-subj",
            "/CN=allowed.test",
        ],
        check=True,
        capture_output=True,
    )
    (d / "ext").write_text("subjectAltName=DNS:allowed.test\n")
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            d / "leaf.csr",
            "-CA",
            d / "ca.pem",
            "-CAkey",
            d / "ca.key",
            "-CAcreateserial",
            "-out",
            d / "leaf.pem",
            "-days",
            "1",
            "-extfile",
            d / "ext",
        ],
        check=True,
        capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "leaf.pem", d / "leaf.key")
    return (d / "ca.pem").read_bytes(), ctx


async def serve_https(port: NetPortStandIn, streams: int, ctx: ssl.SSLContext) -> int:
    """The stand-in as an HTTPS server behind every OPEN (TLS in memory BIOs over the stream);
    returns how many requests it answered."""
    tls: dict[int, tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, list[bytes]]] = {}
    answered = done = 0

    async def flush(sid: int) -> None:
        out = tls[sid][2].read()
        for i in range(0, len(out), DATA_MAX):
            await port.send(frame(DATA, sid, out[i : i + DATA_MAX]))

    while done < streams:
        t, sid, p = await port.next(timeout=90)
        if t == OPEN:
            inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
            tls[sid] = (ctx.wrap_bio(inc, out, server_side=True), inc, out, [b""])
            await port.send(frame(OPENED, sid, u32(OK) + string(b"")))
        elif t == DATA:
            obj, inc, _, req = tls[sid]
            inc.write(p)
            await port.send(frame(CREDIT, sid, u32(len(p))))
            try:
                obj.do_handshake()
                while chunk := obj.read(1 << 16):  # b"": the client's close_notify
                    req[0] += chunk
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLError, ssl.SSLZeroReturnError):
                pass  # e.g. the client refused our certificate: it says so on its side
            if b"\r\n\r\n" in req[0]:
                req[0] = b""
                body = b"trusted hello"
                obj.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (len(body), body)
                )
                answered += 1
            await flush(sid)
        elif t == SHUTDOWN:
            await port.send(frame(SHUTDOWN, sid))  # the client is done: so is this side
        elif t == CLOSE:
            await port.send(frame(CLOSE, sid, u32(0)))
            done += 1
        else:
            assert t == CREDIT, t
    return answered


NO_OPENSSL = "needs the openssl command to make a test CA"


@pytest.mark.skipif(shutil.which("openssl") is None, reason=NO_OPENSSL)
async def test_net_config_ca_bundle_is_what_every_client_trusts(
    net_vm: tuple[GuestVm, NetPortStandIn],
    tmp_path: Path,
) -> None:
    vm, port = net_vm
    ca, ctx = make_test_ca(tmp_path)
    await send_agent_frame(vm, NET_CONFIG, 906, net_config(["allowed.test"], [], ca))
    # The test CA is valid from this second on, and a cold-booted guest's clock (the RTC's
    # whole seconds) can lag the host's: give it the host's before anything verifies.
    await vm.reseed()
    script = (
        "curl -sS --max-time 60 https://allowed.test/; echo\n"
        'python3 -c "import urllib.request as u; '
        "print(u.urlopen('https://allowed.test/', timeout=60).read().decode())\"\n"
        "node -e \"fetch('https://allowed.test/').then(r => r.text()).then(console.log)\""
        " 2>/dev/null\n"
    )
    run = asyncio.create_task(vm.execute(_raw(script)))
    answered = await serve_https(port, 3, ctx)
    r = await run
    # Signed by a CA only NET_CONFIG brought: curl (the system bundle), python (SSL_CERT_FILE)
    # and node (NODE_EXTRA_CA_CERTS) all verified the certificate.
    assert r.stdout.splitlines() == ["trusted hello"] * 3, r
    assert answered == 3


@pytest.mark.skipif(shutil.which("openssl") is None, reason=NO_OPENSSL)
async def test_a_node_prestarted_before_net_config_is_not_the_one_that_runs(
    net_vm: tuple[GuestVm, NetPortStandIn],
    tmp_path: Path,
) -> None:
    # node reads NODE_EXTRA_CA_CERTS once at its start: a pooled VM's pre-started node (PRESTART
    # comes before NET_CONFIG there) must not serve the run, or the host's CA is not trusted.
    vm, port = net_vm
    ca, ctx = make_test_ca(tmp_path)
    assert await vm.prestart("javascript")
    await send_agent_frame(vm, NET_CONFIG, 907, net_config(["allowed.test"], [], ca))
    await vm.reseed()  # the guest's clock to the host's: the test CA is valid from now on
    code = (
        "fetch('https://allowed.test/')"
        ".then(r => r.text()).then(console.log, e => console.log(String(e.cause)))"
    )
    js = ExecRequest("javascript", code.encode(), 120_000, [], 1 << 16, 1 << 16)
    run = asyncio.create_task(vm.execute(js))
    await serve_https(port, 1, ctx)
    r = await run
    assert r.stdout == "trusted hello\n", r
