#!/usr/bin/env python3
"""Host-side test of the guest agent (guest/build/sbx-agent) in test mode.

The agent runs as an ordinary process with one end of a socketpair as its channel
(--channel-fd), so everything but the PID-1 boot steps (mounts, hostname, loopback, uid switch)
is exercised: framing, validation, spawning, streaming, limits, timeouts, reaping.

The frame codec here is written independently of src/shared/frame.c on purpose: it checks the
agent against protocol.h, not against itself.

Usage: guest_agent_test.py [--agent PATH] [-k SUBSTRING]   (run by `make -C guest test`)
"""

from __future__ import annotations

import argparse
import fcntl
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import traceback

# protocol.h
READY, STDOUT, STDERR, EXIT, ERROR, PONG = 1, 2, 3, 4, 5, 6
EXEC, PING = 64, 65
FILE_DATA, FILE_ENTRIES, FILE_DONE, FILE_ERROR = 7, 8, 9, 10
SESSION_EXEC, WRITE_BEGIN, WRITE_DATA, WRITE_END, FILE_READ, FILE_LIST = 66, 67, 68, 69, 70, 71
PRESTART = 97
FILE_ERR_PATH, FILE_ERR_NOT_FOUND, FILE_ERR_PROTOCOL = 1, 2, 5
FILE_NODE_SNAPSHOT, NODE_TAG_SIZE, FILE_ERR_REFUSED = 2, 64, 6
PYTHON, JAVASCRIPT, RAW = 1, 2, 3
TIMED_OUT, STDOUT_LIMIT, STDERR_LIMIT, REPL_RESET = 1, 2, 4, 8
ERR_BAD_REQUEST, ERR_BUSY, ERR_SPAWN, ERR_INTERNAL = 1, 2, 3, 4
HEADER = struct.Struct("<IBBHI")
GUEST_FRAME_MAX = 64 * 1024
OUTPUT_CHUNK_MAX = 32 * 1024
CODE_MAX = 1024 * 1024

AGENT = os.path.join(os.path.dirname(__file__), "..", "..", "guest", "build", "sbx-agent")
DRIVERS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "guest", "repl"))


# Builds a root like the guest's (read-only, with empty mount points) out of the host's /usr
# and /etc, inside the new mount namespace, and makes the agent its PID 1.
BOOT_SCRIPT = r"""
set -eu
root=$1 agent=$2 fd=$3
shift 3
mount --make-rprivate /
mount -t tmpfs -o size=8m,mode=0755 tmpfs "$root"
mkdir -p "$root/usr" "$root/etc" "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/run" \
	"$root/home/user"
for d in bin sbin lib lib64; do
	if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"; fi
done
for d in usr etc; do
	mount --rbind "/$d" "$root/$d"
	mount -o remount,bind,ro "$root/$d"
done
# A /dev that is already a mount point: the agent then leaves it alone, as with the kernel's
# devtmpfs in the VM, instead of mounting the host's devtmpfs.
mount -t tmpfs -o size=1m,mode=0755 tmpfs "$root/dev"
for n in null zero full random urandom tty; do
	touch "$root/dev/$n"
	mount --bind "/dev/$n" "$root/dev/$n"
done
cp "$agent" "$root/sbx-agent"
mount -o remount,ro "$root"
exec chroot "$root" /sbx-agent --channel-fd "$fd" --boot "$@"
"""


def frame(msg_type: int, req_id: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return HEADER.pack(len(payload), msg_type, flags, 0, req_id) + payload


def s(data: bytes | str) -> bytes:
    if isinstance(data, str):
        data = data.encode()
    return struct.pack("<I", len(data)) + data


def exec_payload(
    code: str | bytes,
    language: int = RAW,
    timeout_ms: int = 10_000,
    stdout_limit: int = 1 << 20,
    stderr_limit: int = 100 << 10,
    env: dict[str, str] | list[tuple[bytes, bytes]] | None = None,
) -> bytes:
    items = list(env.items()) if isinstance(env, dict) else (env or [])
    out = struct.pack("<BIIII", language, timeout_ms, stdout_limit, stderr_limit, len(items))
    for name, value in items:
        out += s(name) + s(value)
    return out + s(code)


class Agent:
    def __init__(
        self, *extra: str, boot: bool = False, pass_fds: tuple[int, ...] = (), preexec_fn=None
    ) -> None:  # type: ignore[no-untyped-def]
        self.work = tempfile.TemporaryDirectory(prefix="sbx-agent-test.")
        ours, theirs = socket.socketpair()
        self.sock = ours
        fd = str(theirs.fileno())
        if boot:
            # PID 1 of fresh namespaces, chrooted into a read-only root: the VM's boot path.
            cmd = [
                "unshare",
                "--pid",
                "--mount",
                "--uts",
                "--net",
                "--ipc",
                "--fork",
                "--kill-child",
                "sh",
                "-c",
                BOOT_SCRIPT,
                "boot",
                self.work.name,
                AGENT,
                fd,
                *extra,
            ]
        else:
            # The drivers' directory holds node's pre-start preload too (guest/repl/prestart.js).
            if "--driver-dir" not in extra:
                extra = ("--driver-dir", DRIVERS, *extra)
            cmd = [AGENT, "--channel-fd", fd, "--work-dir", self.work.name, *extra]
        self.proc = subprocess.Popen(
            cmd,
            pass_fds=[theirs.fileno(), *pass_fds],
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            preexec_fn=preexec_fn,
        )
        theirs.close()
        self.buf = b""
        line = self.proc.stdout.readline()
        assert line == b"sbx-agent: ready\n", line

    def close(self, cleanup: bool = True) -> int:
        self.sock.close()
        try:
            rc = self.proc.wait(timeout=5)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.stdout.close()
            if cleanup:
                self.work.cleanup()
        return rc

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 5.0) -> tuple[int, int, bytes] | None:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= HEADER.size:
                length, mtype, flags, reserved, req_id = HEADER.unpack_from(self.buf)
                assert flags == 0 and reserved == 0, "agent sent non-zero reserved bits"
                assert length <= GUEST_FRAME_MAX, f"guest frame of {length} bytes"
                if len(self.buf) >= HEADER.size + length:
                    payload = self.buf[HEADER.size : HEADER.size + length]
                    self.buf = self.buf[HEADER.size + length :]
                    return mtype, req_id, payload
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.sock], [], [], left)
            if r:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return None
                self.buf += chunk

    def expect(self, timeout: float = 5.0) -> tuple[int, int, bytes]:
        f = self.recv(timeout)
        assert f is not None, "no frame from the agent"
        return f

    def run(self, req_id: int, code: str | bytes, timeout: float = 15.0, **kw) -> dict:
        self.send(frame(EXEC, req_id, exec_payload(code, **kw)))
        return self.collect(req_id, timeout)

    def collect(self, req_id: int, timeout: float = 15.0) -> dict:
        res = {"stdout": b"", "stderr": b"", "chunks": 0}
        deadline = time.monotonic() + timeout
        while True:
            mtype, fid, payload = self.expect(max(0.0, deadline - time.monotonic()))
            assert fid == req_id, f"frame type {mtype} for id {fid}, expected {req_id}"
            if mtype in (STDOUT, STDERR):
                assert 1 <= len(payload) <= OUTPUT_CHUNK_MAX, len(payload)
                res["stdout" if mtype == STDOUT else "stderr"] += payload
                res["chunks"] += 1
            elif mtype == EXIT:
                assert len(payload) == 16, len(payload)
                res["exit"], res["flags"], res["duration_us"] = struct.unpack("<iIQ", payload)
                return res
            elif mtype == ERROR:
                res["error"], res["message"] = decode_error(payload)
                return res
            else:
                raise AssertionError(f"unexpected frame type {mtype}")


def decode_error(payload: bytes) -> tuple[int, str]:
    code, n = struct.unpack_from("<II", payload)
    assert len(payload) == 8 + n and n <= 1024, "malformed ERROR payload"
    return code, payload[8:].decode()


# --- tests ---------------------------------------------------------------------------------------

# net_protocol.h
NET_CONFIG = 104
NET_CONNECTED, NET_CONNECT = 49, 113
NET_DATA, NET_CREDIT, NET_SHUTDOWN, NET_CLOSE = 120, 121, 122, 123
NET_WINDOW, NET_DATA_MAX = 1024 * 1024, 60 * 1024


class NetPeer:
    """The host end of the net port in test mode (--net-fd): frames over a socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, t: int, sid: int, payload: bytes = b"") -> None:
        self.sock.sendall(frame(t, sid, payload))

    def recv(self, timeout: float = 5.0) -> tuple[int, int, bytes] | None:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= HEADER.size:
                length, t, flags, reserved, sid = HEADER.unpack_from(self.buf)
                assert flags == 0 and reserved == 0 and length <= 64 * 1024
                if len(self.buf) >= HEADER.size + length:
                    payload = self.buf[HEADER.size : HEADER.size + length]
                    self.buf = self.buf[HEADER.size + length :]
                    return t, sid, payload
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buf += chunk


class NetRig:
    """An agent in test mode with its net port (configured for exposed ports only, unless told
    not to), and a server on the host's loopback for its NET_CONNECTs to reach."""

    def __init__(self, configure: bool = True) -> None:
        ours, theirs = socket.socketpair()
        # A port that holds little, like virtio-serial's queue: the agent's own buffer fills.
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        self.agent = Agent("--net-fd", str(theirs.fileno()), pass_fds=(theirs.fileno(),))
        theirs.close()
        self.net = NetPeer(ours)
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        assert self.agent.expect()[0] == READY
        if configure:
            self.agent.send(frame(NET_CONFIG, 1, struct.pack("<III", 0, 0, 0) + s(b"")))
            assert self.agent.expect() == (PONG, 1, b"")

    def connect(self, hid: int) -> socket.socket:
        self.net.send(NET_CONNECT, hid, struct.pack("<I", self.server.getsockname()[1]))
        assert self.net.recv() == (NET_CONNECTED, hid, struct.pack("<I", 0))
        return self.server.accept()[0]

    def wait_port_full(self) -> None:
        """Until the agent has stopped writing to its port (nobody reads it): what the port
        holds no longer grows."""
        seen, steady = -1, 0
        deadline = time.monotonic() + 10
        while steady < 3:
            assert time.monotonic() < deadline, "the agent never filled its port"
            time.sleep(0.05)
            queued = struct.unpack("i", fcntl.ioctl(self.net.sock, termios.FIONREAD, b"\0" * 4))[0]
            steady = steady + 1 if queued == seen and queued > 0 else 0
            seen = queued

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.agent.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.server.close()
        self.net.sock.close()
        assert self.agent.close() == 0


def test_net_relay_in_test_mode() -> None:
    """NET_CONNECT (exposed ports) through the agent's relay, against a server on the host's
    loopback: credit flow control both ways, half closes, a clean close, a refused connect, and a
    host that overruns the window losing only that stream. (Outbound, the DNS stub and the
    listeners change lo and need the VM: tests/integration/functional/test_net_guest.py.)"""
    rig = NetRig(configure=False)
    a, net, server, ours = rig.agent, rig.net, rig.server, rig.net.sock
    port = server.getsockname()[1]
    try:
        config = struct.pack("<III", 0, 0, 0) + s(b"")
        outbound = struct.pack("<III", 1, 0, 0) + s(b"")
        a.send(frame(NET_CONFIG, 3, outbound))  # would touch the host's lo: refused
        t, fid, payload = a.expect()
        assert (t, fid) == (ERROR, 3) and "network namespace" in decode_error(payload)[1]
        a.send(frame(NET_CONFIG, 4, config))
        assert a.expect() == (PONG, 4, b"")
        a.send(frame(NET_CONFIG, 5, config))
        t, fid, payload = a.expect()
        assert (t, fid) == (ERROR, 5) and decode_error(payload)[0] == 1  # BAD_REQUEST: twice

        hid = 0x80000001
        net.send(NET_CONNECT, hid, struct.pack("<I", port))
        assert net.recv() == (NET_CONNECTED, hid, struct.pack("<I", 0))
        conn, _ = server.accept()
        net.send(NET_DATA, hid, b"ping")
        assert conn.recv(100) == b"ping"
        assert net.recv() == (NET_CREDIT, hid, struct.pack("<I", 4))
        # Guest -> host: never more than a window before the host credits.
        conn.setblocking(False)
        blob = os.urandom(2 * NET_WINDOW + 300 * 1024)
        sent = 0
        got = b""
        while len(got) < NET_WINDOW:
            try:
                sent += conn.send(blob[sent:])
            except BlockingIOError:
                pass
            f = net.recv(timeout=10)
            assert f is not None and f[0] == NET_DATA and 1 <= len(f[2]) <= NET_DATA_MAX, f
            got += f[2]
        assert len(got) == NET_WINDOW and net.recv(timeout=0.5) is None, len(got)  # and no more
        while len(got) < len(blob):
            net.send(NET_CREDIT, hid, struct.pack("<I", NET_WINDOW // 4))
            while True:
                try:
                    sent += conn.send(blob[sent:]) if sent < len(blob) else 0
                except BlockingIOError:
                    pass
                f = net.recv(timeout=0.3)
                if f is None:
                    break
                got += f[2]
        assert got == blob
        # Half closes both ways, then the agent's CLOSE(done), answered.
        conn.setblocking(True)
        conn.shutdown(socket.SHUT_WR)
        assert net.recv() == (NET_SHUTDOWN, hid, b"")
        net.send(NET_SHUTDOWN, hid)
        assert conn.recv(10) == b""
        conn.close()
        assert net.recv() == (NET_CLOSE, hid, struct.pack("<I", 0))
        net.send(NET_CLOSE, hid, struct.pack("<I", 0))
        # Nothing listens: refused at once, and the id is free for the next try.
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
        closed.close()
        net.send(NET_CONNECT, hid, struct.pack("<I", dead))
        assert net.recv() == (NET_CONNECTED, hid, struct.pack("<I", 4))
        # A host past the window (the server does not read): CLOSE(reset), the agent lives on.
        net.send(NET_CONNECT, hid, struct.pack("<I", port))
        assert net.recv() == (NET_CONNECTED, hid, struct.pack("<I", 0))
        stuck, _ = server.accept()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        closing = None
        for _ in range(200):
            net.send(NET_DATA, hid, b"x" * NET_DATA_MAX)
            f = net.recv(timeout=0.01)
            while f is not None and f[0] == NET_CREDIT:
                f = net.recv(timeout=0.01)
            if f is not None:
                closing = f
                break
        assert closing == (NET_CLOSE, hid, struct.pack("<I", 1)), closing
        net.send(NET_CLOSE, hid, struct.pack("<I", 1))
        stuck.close()
        # Broken framing on the net port costs the port, not the agent.
        ours.sendall(HEADER.pack(4, NET_DATA, 1, 0, 5) + b"oops")
        a.send(frame(PING, 6))
        assert a.expect() == (PONG, 6, b"")
    finally:
        rig.close()


def test_net_reattach_resets_the_old_streams() -> None:
    """NET_CONFIG with REATTACH (a VM restored from a state saved with network): the streams of
    the old host are reset (the guest program sees it), a frame half read from the old host is
    dropped, the mark goes out on the port, and the new host's frames are served. A reattach
    that changes the outbound flag or the extra ports is refused; the network goes on as
    reattached."""
    rig = NetRig()
    a, net = rig.agent, rig.net
    try:
        conn = rig.connect(0x80000001)
        net.sock.sendall(HEADER.pack(64, NET_DATA, 0, 0, 0x80000001)[:10])  # the old host's half
        time.sleep(0.3)  # read by the agent before the reattach
        reattach = struct.pack("<III", 2, 0, 0) + s(b"")
        a.send(frame(NET_CONFIG, 7, reattach))
        assert a.expect() == (PONG, 7, b"")
        # The mark first (net_protocol.h): nothing was queued for the old host here.
        mark = b"\xff\xff\xff\xffsbx-net-reattached\xff\xff\xff\xff"
        while len(net.buf) < len(mark) and select.select([net.sock], [], [], 5)[0]:
            net.buf += net.sock.recv(len(mark) - len(net.buf))
        assert net.buf == mark
        net.buf = b""
        conn.settimeout(5)
        try:
            assert conn.recv(10) == b""
        except ConnectionResetError:
            pass  # reset: what SO_LINGER 0 gives
        conn.close()
        # The same id again: the table was emptied, the half frame forgotten.
        again = rig.connect(0x80000001)
        net.send(NET_DATA, 0x80000001, b"pong")
        assert again.recv(100) == b"pong"
        again.close()
        other = struct.pack("<IIII", 2, 0, 1, 8080) + s(b"")
        a.send(frame(NET_CONFIG, 8, other))
        t, fid, payload = a.expect()
        assert (t, fid) == (ERROR, 8) and "reattach" in decode_error(payload)[1]
    finally:
        rig.close()


def test_net_streams_share_a_backed_up_port() -> None:
    """Three streams whose servers never stop sending, and a host slower than they are: the
    port, not the sockets, is the bottleneck, and each stream gets its share of it. (A relay
    that reads one socket on while the port has room starves the others.)"""
    rig = NetRig()
    stop = threading.Event()
    ids = [0x80000011, 0x80000012, 0x80000013]
    servers = [rig.connect(hid) for hid in ids]

    def pour(conn: socket.socket) -> None:
        block = b"x" * (256 * 1024)
        try:
            while not stop.is_set():
                conn.sendall(block)
        except OSError:
            pass

    pourers = [threading.Thread(target=pour, args=(c,), daemon=True) for c in servers]
    got = dict.fromkeys(ids, 0)
    owed = dict.fromkeys(ids, 0)
    try:
        for t in pourers:
            t.start()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            f = rig.net.recv(timeout=1.0)
            assert f is not None and f[0] == NET_DATA and f[1] in got, f
            got[f[1]] += len(f[2])
            owed[f[1]] += len(f[2])
            if owed[f[1]] >= NET_WINDOW // 4:  # credit back like the host does
                rig.net.send(NET_CREDIT, f[1], struct.pack("<I", owed[f[1]]))
                owed[f[1]] = 0
            time.sleep(0.0002)  # slower than the servers: the port backs up
        shares = sorted(got.values())
        assert shares[0] >= NET_WINDOW and shares[0] >= shares[-1] / 2, got
    finally:
        stop.set()
        for c in servers:
            c.close()
        rig.close()


def test_net_hung_up_stream_with_a_backed_up_port_does_not_spin() -> None:
    """A stream closed both ways with data still unread, while another stream has filled the
    port and the host reads nothing: the socket reports EPOLLHUP on every wait, and the agent
    (PID 1 in the VM) must wait, not loop on it. Once the host reads again, every byte of both
    streams and the half close arrive."""
    rig = NetRig()
    bulk, hung = 0x80000021, 0x80000022
    try:
        bulk_conn, hung_conn = rig.connect(bulk), rig.connect(hung)
        rig.net.send(NET_SHUTDOWN, hung)
        assert hung_conn.recv(10) == b""  # the agent shut its write side
        bulk_blob, hung_blob = os.urandom(NET_WINDOW - 1), os.urandom(100 * 1024)
        pour = threading.Thread(target=bulk_conn.sendall, args=(bulk_blob,), daemon=True)
        pour.start()
        rig.wait_port_full()  # the bulk stream's credit is past the port and its high water
        hung_conn.sendall(hung_blob)
        hung_conn.close()
        time.sleep(0.3)
        before = rig.cpu_seconds()
        time.sleep(1.0)
        spent = rig.cpu_seconds() - before
        assert spent < 0.2, f"the agent used {spent:.2f} s of CPU in 1 s while waiting"
        got = {bulk: b"", hung: b""}
        ends = []
        while len(got[bulk]) < len(bulk_blob) or len(ends) < 2:
            f = rig.net.recv(timeout=5)
            assert f is not None and f[1] in got, (f, len(got[bulk]), ends)
            if f[0] == NET_DATA:
                got[f[1]] += f[2]
                rig.net.send(NET_CREDIT, f[1], struct.pack("<I", len(f[2])))
            else:
                ends.append(f)
        assert got == {bulk: bulk_blob, hung: hung_blob}
        assert ends == [(NET_SHUTDOWN, hung, b""), (NET_CLOSE, hung, struct.pack("<I", 0))]
        rig.net.send(NET_CLOSE, hung, struct.pack("<I", 0))
        bulk_conn.close()
    finally:
        rig.close()


def test_net_reused_slot_does_not_take_the_old_sockets_event() -> None:
    """One wait of the agent's loop returns the port (the host's CLOSE of a stream, then a
    CONNECT that takes the freed slot) and then the old socket's reset. The reset belongs to a
    socket that is gone: the new stream must connect, not fail in its place."""
    rig = NetRig()
    old, new = 0x80000031, 0x80000032
    try:
        conn = rig.connect(old)
        # A round trip first: the agent's loop has then waited again since the connect, and no
        # earlier event of the old socket is still queued ahead of the port's.
        rig.net.send(NET_DATA, old, b"x")
        assert conn.recv(1) == b"x"
        assert rig.net.recv() == (NET_CREDIT, old, struct.pack("<I", 1))
        time.sleep(0.1)
        os.kill(rig.agent.proc.pid, signal.SIGSTOP)  # both events wait for one epoll_wait
        try:
            rig.net.send(NET_CLOSE, old, struct.pack("<I", 0))
            rig.net.send(NET_CONNECT, new, struct.pack("<I", rig.server.getsockname()[1]))
            time.sleep(0.1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # an RST: EPOLLERR and EPOLLHUP on the agent's old socket
            time.sleep(0.1)
        finally:
            os.kill(rig.agent.proc.pid, signal.SIGCONT)
        assert rig.net.recv() == (NET_CLOSE, old, struct.pack("<I", 0))
        got = rig.net.recv()
        assert got == (NET_CONNECTED, new, struct.pack("<I", 0)), got
        rig.server.accept()[0].close()
    finally:
        rig.close()


def test_ready_and_ping(a: Agent) -> None:
    a.send(frame(PING, 7))
    assert a.expect() == (PONG, 7, b"")
    # Two frames in one write, and one frame dribbled in byte by byte.
    a.send(frame(PING, 8) + frame(PING, 9))
    assert a.expect() == (PONG, 8, b"")
    assert a.expect() == (PONG, 9, b"")
    for byte in frame(PING, 10):
        a.send(bytes([byte]))
        time.sleep(0.002)
    assert a.expect() == (PONG, 10, b"")


def test_bash_stdout_stderr_exit_code(a: Agent) -> None:
    r = a.run(1, "echo hi; echo err >&2; exit 3")
    assert (r["stdout"], r["stderr"], r["exit"], r["flags"]) == (b"hi\n", b"err\n", 3, 0), r
    assert 0 < r["duration_us"] < 5_000_000


def test_killed_by_signal_is_128_plus_n(a: Agent) -> None:
    r = a.run(2, "kill -9 $$")
    assert (r["exit"], r["flags"]) == (137, 0), r


def test_timeout(a: Agent) -> None:
    t0 = time.monotonic()
    r = a.run(3, "echo started; sleep 10", timeout_ms=1000)
    elapsed = time.monotonic() - t0
    assert r["stdout"] == b"started\n", r
    assert (r["exit"], r["flags"]) == (-1, TIMED_OUT), r
    assert elapsed < 2.0, elapsed
    assert 900_000 < r["duration_us"] < 2_000_000, r["duration_us"]


def test_timeout_none_lets_the_code_run_until_it_ends(a: Agent) -> None:
    # 0 is "no limit" (timeout_seconds=0): no timer at all, however long the code takes.
    r = a.run(31, "sleep 1.5; echo done", timeout_ms=0)
    assert (r["stdout"], r["exit"], r["flags"]) == (b"done\n", 0, 0), r
    r = a.run(32, "echo longest", timeout_ms=86_400_000)
    assert (r["stdout"], r["exit"]) == (b"longest\n", 0), r


def test_timeout_ignoring_sigterm_gets_sigkill(a: Agent) -> None:
    t0 = time.monotonic()
    r = a.run(4, "trap '' TERM; while :; do sleep 0.05; done", timeout_ms=300)
    assert (r["exit"], r["flags"]) == (-1, TIMED_OUT), r
    assert time.monotonic() - t0 < 2.0


def test_stdout_limit(a: Agent) -> None:
    r = a.run(5, "yes", stdout_limit=100_000)
    assert r["flags"] & STDOUT_LIMIT and not r["flags"] & TIMED_OUT, r
    assert len(r["stdout"]) == 100_000, len(r["stdout"])
    assert r["stdout"] == b"y\n" * 50_000
    assert r["exit"] == 137, r["exit"]


def test_stderr_limit(a: Agent) -> None:
    r = a.run(6, "head -c 200000 /dev/zero | tr '\\0' e >&2; echo after", stderr_limit=1000)
    assert r["flags"] == STDERR_LIMIT, r
    assert r["stderr"] == b"e" * 1000


def test_output_exactly_at_limit_is_whole(a: Agent) -> None:
    r = a.run(
        7, "import sys; sys.stdout.write('y' * 1_000_000)", language=PYTHON, stdout_limit=1_000_000
    )
    assert (r["exit"], r["flags"]) == (0, 0), {k: v for k, v in r.items() if k != "stdout"}
    assert r["stdout"] == b"y" * 1_000_000
    assert r["chunks"] >= 1_000_000 // OUTPUT_CHUNK_MAX


def test_timeout_enforced_while_host_not_reading(a: Agent) -> None:
    # The agent's writes queue up (and stop at a high-water mark) instead of blocking its loop.
    a.send(frame(EXEC, 30, exec_payload("yes", timeout_ms=500, stdout_limit=0xFFFFFFFF)))
    time.sleep(2.0)
    r = a.collect(30)
    assert (r["exit"], r["flags"]) == (-1, TIMED_OUT), {k: r[k] for k in ("exit", "flags")}
    assert 400_000 < r["duration_us"] < 1_500_000, r["duration_us"]
    assert len(r["stdout"]) < 4 << 20, len(r["stdout"])


def test_output_complete_when_host_lags_at_exit(a: Agent) -> None:
    # The process exits while its last output sits in the pipe and the queue is full: the drain
    # deadline must not cut that tail off.
    a.send(
        frame(
            EXEC, 31, exec_payload("import sys; sys.stdout.write('z' * 600_000)", language=PYTHON)
        )
    )
    time.sleep(1.5)
    r = a.collect(31)
    assert (r["exit"], r["flags"]) == (0, 0), {k: r[k] for k in ("exit", "flags")}
    assert r["stdout"] == b"z" * 600_000, len(r["stdout"])


def test_python_env_and_cwd(a: Agent) -> None:
    code = (
        "import os, sys\n"
        "print(os.getcwd() == os.environ['HOME'], os.environ['GREETING'],"
        " os.environ['LANG'], os.environ['PYTHONUNBUFFERED'], os.environ['USER'])\n"
        "print(repr(sys.stdin.read()))\n"
    )
    r = a.run(8, code, language=PYTHON, env={"GREETING": "hello world", "LANG": "en_US.UTF-8"})
    assert r["stdout"] == b"True hello world en_US.UTF-8 1 user\n''\n", r
    assert r["exit"] == 0


def test_clean_environment(a: Agent) -> None:
    r = a.run(9, "env | sort", env={"A_1": "x=y", "EMPTY": ""})
    env = dict(line.split("=", 1) for line in r["stdout"].decode().splitlines())
    env.pop("_", None)
    env.pop("PWD", None), env.pop("SHLVL", None)  # added by bash itself
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": env["HOME"],
        "USER": "user",
        "LOGNAME": "user",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "module://exec_sandbox_guest.mpl_backend",
        "A_1": "x=y",
        "EMPTY": "",
        # Test mode only: the runtimes default to /run/sbx/host.sock.
        "EXEC_SANDBOX_HOST_SOCKET": host_socket_path(a),
    }, env


def test_javascript(a: Agent) -> None:
    r = a.run(
        10,
        "console.log([1, 2, 3].map(x => x * 2).join(','));"
        "console.error(typeof require); process.exit(4)",
        language=JAVASCRIPT,
    )
    assert (r["stdout"], r["stderr"], r["exit"]) == (b"2,4,6\n", b"function\n", 4), r


def test_fds_and_session(a: Agent) -> None:
    # Only 0-2 are inherited (plus the one bash opens for the script), stdin is /dev/null,
    # and the code leads its own session.
    code = (
        "import os\n"
        "print(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n"
        "print(os.readlink('/proc/self/fd/0'))\n"
        "print(os.getsid(0) == os.getpid() == os.getpgid(0))\n"
    )
    r = a.run(11, code, language=PYTHON)
    lines = r["stdout"].decode().splitlines()
    assert lines[0] in ("[0, 1, 2]", "[0, 1, 2, 3]"), lines  # 3: listdir's own fd
    assert lines[1:] == ["/dev/null", "True"], lines


def test_busy(a: Agent) -> None:
    a.send(frame(EXEC, 20, exec_payload("sleep 0.5; echo first")))
    time.sleep(0.1)
    a.send(frame(EXEC, 21, exec_payload("echo second")))
    mtype, fid, payload = a.expect()
    assert (mtype, fid) == (ERROR, 21), (mtype, fid, payload)
    assert decode_error(payload)[0] == ERR_BUSY
    r = a.collect(20)
    assert (r["stdout"], r["exit"]) == (b"first\n", 0), r
    # Ready for the next one at once.
    assert a.run(22, "echo third")["stdout"] == b"third\n"


def test_escaped_daemon_does_not_hold_the_exit(a: Agent) -> None:
    # The sleep 0.1 lets setsid leave the group before the group is killed; the escaped
    # sleep then holds stdout open, and the agent gives up waiting for EOF after ~200 ms.
    t0 = time.monotonic()
    r = a.run(23, "setsid sleep 3 & sleep 0.1; echo done")
    elapsed = time.monotonic() - t0
    assert (r["stdout"], r["exit"]) == (b"done\n", 0), r
    assert 0.25 < elapsed < 1.0, elapsed


def test_orphans_are_reaped(a: Agent) -> None:
    # Escaped grandchildren outlive the run and are reparented to the agent (a subreaper in
    # test mode, PID 1 in the VM), which must reap them.
    r = a.run(24, "(setsid sleep 0.2 >/dev/null &); (setsid sleep 0.3 >/dev/null &); sleep 0.05")
    assert r["exit"] == 0
    time.sleep(0.8)
    zombies = []
    for task in os.listdir(f"/proc/{a.proc.pid}/task"):
        path = f"/proc/{a.proc.pid}/task/{task}/children"
        for child in open(path).read().split():
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    zombies.append(child)
    assert not zombies, zombies


def test_large_code(a: Agent) -> None:
    code = "#" * (CODE_MAX - 20) + "\necho big"
    assert len(code) <= CODE_MAX
    r = a.run(25, code)
    assert (r["stdout"], r["exit"]) == (b"big\n", 0), r


def test_bad_requests_keep_the_stream(a: Agent) -> None:
    hdr = lambda lang=RAW, t=1000, n=0: struct.pack("<BIIII", lang, t, 100, 100, n)  # noqa: E731
    bad = {
        "unknown language": hdr(lang=9) + s("true"),
        "timeout too long": hdr(t=86_400_001) + s("true"),
        "timeout far too long": hdr(t=0xFFFFFFFF) + s("true"),
        "too many env vars": hdr(n=101) + (s("A") + s("b")) * 101 + s("true"),
        "env name digit first": hdr(n=1) + s("1A") + s("b") + s("true"),
        "env name with '='": hdr(n=1) + s("A=B") + s("b") + s("true"),
        "env name empty": hdr(n=1) + s("") + s("b") + s("true"),
        "env name too long": hdr(n=1) + s("A" * 257) + s("b") + s("true"),
        "env value with NUL": hdr(n=1) + s("A") + s(b"x\0y") + s("true"),
        "env value too long": hdr(n=1) + s("A") + s("v" * (32 * 1024 + 1)) + s("true"),
        "code too long": hdr() + s("#" * (CODE_MAX + 1)),
        "code length past end": hdr() + struct.pack("<I", 10) + b"true",
        "trailing bytes": hdr() + s("true") + b"x",
        "truncated header": hdr()[:7],
        "empty": b"",
    }
    for i, (what, payload) in enumerate(bad.items()):
        a.send(frame(EXEC, 100 + i, payload))
        mtype, fid, err = a.expect()
        assert (mtype, fid) == (ERROR, 100 + i), (what, mtype, fid)
        assert decode_error(err)[0] == ERR_BAD_REQUEST, (what, decode_error(err))
    a.send(frame(PING, 200, b"x"))
    mtype, fid, err = a.expect()
    assert (mtype, fid, decode_error(err)[0]) == (ERROR, 200, ERR_BAD_REQUEST)
    a.send(frame(READY, 201))
    mtype, fid, err = a.expect()
    assert (mtype, fid, decode_error(err)[0]) == (ERROR, 201, ERR_BAD_REQUEST)
    # Still in sync: the longest valid env entries work.
    r = a.run(202, 'echo "${#' + "N" * 256 + '}"', env={"N" * 256: "v" * 32 * 1024})
    assert r["stdout"] == b"32768\n", r
    a.send(frame(PING, 203))
    assert a.expect() == (PONG, 203, b"")


def test_broken_framing_is_sticky(a: Agent) -> None:
    a.send(frame(PING, 300, flags=1))
    mtype, fid, err = a.expect()
    assert (mtype, decode_error(err)[0]) == (ERROR, ERR_BAD_REQUEST), (mtype, fid, err)
    a.send(frame(PING, 301))
    assert a.recv(timeout=0.5) is None, "agent kept reading after a framing error"


def test_oversized_frame_is_refused(a: Agent) -> None:
    a.send(HEADER.pack(2 * 1024 * 1024 + 1, EXEC, 0, 0, 400))
    mtype, _, err = a.expect()
    assert (mtype, decode_error(err)[0]) == (ERROR, ERR_BAD_REQUEST)


def test_spawn_failure() -> None:
    a = Agent("--interpreter", "raw=/nonexistent/bash")
    try:
        assert a.expect()[0] == READY
        r = a.run(500, "echo hi")
        assert r.get("error") == ERR_SPAWN and "execve" in r["message"], r
        a.send(frame(PING, 501))
        assert a.expect() == (PONG, 501, b"")
    finally:
        assert a.close() == 0


def test_user_code_runs_sched_batch_from_the_agents_sched_other() -> None:
    """spawn.c: user code SCHED_BATCH when the agent is SCHED_OTHER (as in the VM); an agent
    under another policy (here SCHED_IDLE, which an unprivileged process may not leave) passes
    its own on instead of failing every spawn."""
    show = "import os; print(os.sched_getscheduler(0))"
    ours = os.sched_getscheduler(0)  # the agent's when started as it is
    for preexec, policy in (
        (None, os.SCHED_BATCH if ours == os.SCHED_OTHER else ours),
        (lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)), os.SCHED_IDLE),
    ):
        a = Agent(preexec_fn=preexec)
        try:
            assert a.expect()[0] == READY
            r = a.run(510, show, language=PYTHON)
            assert (r.get("exit"), r["stdout"]) == (0, f"{policy}\n".encode()), r
        finally:
            assert a.close() == 0


def test_hangup_kills_the_run_and_exits() -> None:
    a = Agent()
    assert a.expect()[0] == READY
    marker = os.path.join(a.work.name, "home", "alive")
    a.send(frame(EXEC, 600, exec_payload(f"sleep 0.5; touch {marker}")))
    time.sleep(0.1)
    try:
        assert a.close(cleanup=False) == 0  # the agent exits when the host end closes
        time.sleep(0.8)
        assert not os.path.exists(marker), "the run outlived the agent"
    finally:
        a.work.cleanup()


# --- boot path: PID 1 of fresh namespaces (root only) ----------------------------------------


def test_boot_in_namespaces() -> None:
    a = Agent(boot=True)
    try:
        assert a.expect()[0] == READY

        def sh(code: str, **kw) -> str:
            r = a.run(sh.n, code, **kw)
            sh.n += 1
            assert r.get("exit") == 0 and r["stderr"] == b"", r
            return r["stdout"].decode()

        sh.n = 1

        out = sh(
            'id -u; id -g; id -G; pwd; echo "$HOME"; cat /proc/sys/kernel/hostname;'
            ' stat -c "%u:%g %a" /home/user /tmp /run/sbx /dev/shm "$0"; echo "$0"'
        )
        assert out.splitlines() == [
            "1000",
            "1000",
            "1000",
            "/home/user",
            "/home/user",
            "sandbox",
            "1000:1000 700",
            "0:0 1777",
            "0:0 755",
            "0:0 1777",
            "0:0 444",
            "/run/sbx/main.sh",
        ], out
        out = sh(
            'for t in "echo x >> $0" "touch /run/sbx/x" "touch /x" "touch /usr/x"; do'
            ' (eval "$t") 2>/dev/null && echo "$t: allowed" || echo denied; done;'
            " echo ok > ~/f && cat ~/f; echo ok > /tmp/f && cat /tmp/f;"
            " echo ok > /dev/shm/f && cat /dev/shm/f"
        )
        assert out == "denied\n" * 4 + "ok\n" * 3, out
        # hidepid=2: the agent (PID 1) is invisible; no new privileges; limits.
        out = sh(
            "test -e /proc/1 && echo visible || echo hidden; grep NoNewPrivs /proc/self/status;"
            " ulimit -n; ulimit -c; ulimit -u"
        )
        assert out == "hidden\nNoNewPrivs:\t1\n4096\n0\n256\n", out
        out = sh(
            "awk '$2 ~ /^\\/(tmp|run|home\\/user|dev\\/shm|dev\\/pts|proc|sys)$/"
            " {print $2, $3, $4}' /proc/mounts | sort"
        )
        mounts = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
        assert set(mounts) == {
            "/tmp",
            "/run",
            "/home/user",
            "/dev/shm",
            "/dev/pts",
            "/proc",
            "/sys",
        }, out
        for path, (_fstype, opts) in mounts.items():
            opts = opts.split(",")
            assert "nosuid" in opts, (path, opts)
        assert "hidepid=invisible" in mounts["/proc"][1] or "hidepid=2" in mounts["/proc"][1]
        assert mounts["/sys"][1].startswith("ro,")
        # tmpfs sizes are shares of RAM (25% /tmp, 40% /home/user), so a full disk is ENOSPC.
        ram_pages = os.sysconf("SC_PHYS_PAGES")
        page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
        for path, share in (("/tmp", 25), ("/home/user", 40)):
            size_kib = int(
                next(o for o in mounts[path][1].split(",") if o.startswith("size="))[5:-1]
            )
            expected = ram_pages * share // 100 * page_kib
            assert abs(size_kib - expected) <= 4 * page_kib, (path, size_kib, expected)
        # Loopback is up; a pty can be had.
        out = sh(
            "import socket, os\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "c = socket.create_connection(s.getsockname()); c.sendall(b'ping')\n"
            "print(s.accept()[0].recv(4).decode())\n"
            "m, t = os.openpty(); print(os.ttyname(t))\n",
            language=PYTHON,
        )
        assert out == "ping\n/dev/pts/0\n", out
        # The host socket: root's, at its default path (so not named in the environment), and
        # the sandbox user connects to it (a malformed call: refused, nothing for the host).
        out = sh(
            "import os, socket, struct\n"
            "st = os.stat('/run/sbx/host.sock')\n"
            "env = os.environ.get('EXEC_SANDBOX_HOST_SOCKET')\n"
            "print(st.st_uid, oct(st.st_mode & 0o777), env)\n"
            "s = socket.socket(socket.AF_UNIX); s.connect('/run/sbx/host.sock')\n"
            "p = struct.pack('<I', 1) + b'-' + struct.pack('<I', 0)\n"
            "s.sendall(struct.pack('<IBBHI', len(p), 1, 0, 0, 9) + p)\n"
            "h = s.recv(1024); print(h[4], h[8], h[12])\n",
            language=PYTHON,
        )
        assert out == "0 0o666 None\n3 9 2\n", out
        # A daemon that escaped the process group does not outlive its run.
        out = sh("setsid sleep 100 </dev/null >/dev/null 2>&1 & sleep 0.2; echo started")
        assert out == "started\n"
        # /run/sbx: the code file and the session REPL's FIFO directory (listable by root only).
        out = sh(
            "cat /proc/[0-9]*/comm | sort | tr '\\n' ' '; ls /run/sbx;"
            " ls /run/sbx/repl 2>/dev/null || echo unlistable"
        )
        assert "sleep" not in out and out.endswith("main.sh\nrepl\nunlistable\n"), out
    finally:
        assert a.close() == 0


def prestart(a: Agent, req_id: int, language: int) -> None:
    a.send(frame(PRESTART, req_id, bytes([language])))
    assert a.expect() == (PONG, req_id, b"")


# Only the pre-started process runs under `python3 -c <bootstrap>`: its cmdline proves which path
# served the EXEC (user code sees argv as in the script run).
WHO = "import sys\nprint(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1].decode(), sys.argv)\n"  # noqa: E501


def test_prestarted_python_serves_the_next_exec(a: Agent) -> None:
    prestart(a, 30, PYTHON)
    time.sleep(0.3)  # the bootstrap blocks on fd 3: nothing may run or print before the EXEC
    r = a.run(
        31,
        WHO + "import os\nprint(__name__, os.getcwd() == os.environ['HOME'],"
        " repr(sys.stdin.read()), sys.path[0] == os.path.dirname(sys.argv[0]))\n"
        "sys.exit(3)",
        language=PYTHON,
    )
    lines = r["stdout"].decode().splitlines()
    assert lines[0].startswith("-c ['") and lines[0].endswith("/main.py']"), lines
    assert lines[1] == "__main__ True '' True", lines
    assert (r["stderr"], r["exit"], r["flags"]) == (b"", 3, 0), r
    # Used once: the next EXEC is a plain one-shot run.
    r = a.run(32, WHO, language=PYTHON)
    assert r["stdout"].decode().startswith("/"), r


def test_prestarted_python_matches_the_script_run(a: Agent) -> None:
    code = "def f():\n    raise ValueError('boom')\nf()\n"
    cold = a.run(33, code, language=PYTHON)
    prestart(a, 34, PYTHON)
    warm = a.run(35, code, language=PYTHON)
    assert (warm["stdout"], warm["stderr"], warm["exit"]) == (
        cold["stdout"],
        cold["stderr"],
        cold["exit"],
    ), (cold, warm)
    assert b"Traceback (most recent call last):" in warm["stderr"] and warm["exit"] == 1
    prestart(a, 36, PYTHON)
    r = a.run(37, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", language=PYTHON)
    assert r["exit"] == 128 + 15, r
    prestart(a, 38, PYTHON)
    r = a.run(39, "import time\ntime.sleep(30)", language=PYTHON, timeout_ms=300)
    assert (r["exit"], r["flags"]) == (-1, TIMED_OUT), r


def test_prestarted_process_is_not_used_for_env_or_other_languages(a: Agent) -> None:
    prestart(a, 40, PYTHON)
    r = a.run(41, WHO + "import os\nprint(os.environ['X'])", language=PYTHON, env={"X": "y"})
    assert r["stdout"].decode().splitlines()[0].startswith("/") and r["stdout"].endswith(b"y\n"), r
    prestart(a, 42, PYTHON)
    r = a.run(43, "echo $0", language=RAW)
    assert r["exit"] == 0 and r["stdout"].endswith(b"main.sh\n"), r
    # The discarded interpreter is gone: the next python EXEC starts afresh.
    r = a.run(44, WHO, language=PYTHON)
    assert r["stdout"].decode().startswith("/"), r


def test_prestarted_javascript(a: Agent) -> None:
    prestart(a, 45, JAVASCRIPT)
    # execArgv as in a script run: child_process.fork() gives it to the child.
    r = a.run(
        46,
        "console.log(process.argv.length, require.main === module,"
        " typeof require('fs').readFileSync, __filename.endsWith('/main.js'),"
        " JSON.stringify(process.execArgv)); process.exit(4)",
        language=JAVASCRIPT,
    )
    assert (r["stdout"], r["stderr"], r["exit"]) == (b"2 true function true []\n", b"", 4), r
    # Worker threads get node's preloads too: the preload must leave them (and fd 3) alone.
    prestart(a, 47, JAVASCRIPT)
    r = a.run(
        48,
        "const { Worker } = require('worker_threads');\n"
        "new Worker(\"console.log('hi from worker')\", { eval: true })\n"
        "  .on('exit', (code) => console.log('worker exit', code));",
        language=JAVASCRIPT,
    )
    assert (r["stdout"], r["stderr"], r["exit"]) == (b"hi from worker\nworker exit 0\n", b"", 0), r
    # The status node exits with, which an 'exit' listener may change.
    prestart(a, 49, JAVASCRIPT)
    r = a.run(50, "process.on('exit', () => { process.exitCode = 3; });", language=JAVASCRIPT)
    assert (r["stderr"], r["exit"]) == (b"", 3), r


def test_prestarted_python_reports_its_end_before_the_teardown(a: Agent) -> None:
    # A __del__ that blocks the interpreter's teardown: the result must not wait for it (a run that
    # waited would time out). Threads, atexit and the final flush still come first, in order.
    prestart(a, 60, PYTHON)
    r = a.run(
        61,
        "import atexit, sys, threading, time\n"
        "class Slow:\n    def __del__(self):\n        time.sleep(60)\n"
        "keep = Slow()\n"
        "atexit.register(print, 'atexit ran')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined'))).start()\n"
        "sys.stdout.write('buffered ')\n"
        "sys.exit(5)",
        language=PYTHON,
        timeout_ms=10000,
    )
    assert (r["stdout"], r["stderr"], r["exit"], r["flags"]) == (
        b"buffered thread joined\natexit ran\n",
        b"",
        5,
        0,
    ), r
    for req_id, code in (
        (62, "import sys; sys.exit('bye')"),
        (64, "import sys; sys.exit(256 + 7)"),
        (66, "raise SystemExit"),
    ):
        cold = a.run(req_id, code, language=PYTHON)
        prestart(a, req_id + 100, PYTHON)
        warm = a.run(req_id + 1, code, language=PYTHON)
        assert (warm["stdout"], warm["stderr"], warm["exit"]) == (
            cold["stdout"],
            cold["stderr"],
            cold["exit"],
        ), (cold, warm)
    assert (warm["exit"], cold["stderr"]) == (0, b"")
    # The agent ends the run on the report itself, without waiting for the process to die (here
    # the code forges one: it can only end its own run, early), and leaves nothing running.
    prestart(a, 68, PYTHON)
    r = a.run(
        69,
        "import os, time\nprint(os.getpid(), flush=True)\nos.write(3, b'd\\x07')\ntime.sleep(60)",
        language=PYTHON,
        timeout_ms=10000,
    )
    assert (r["exit"], r["flags"]) == (7, 0), r
    pid = int(r["stdout"])
    r = a.run(
        169,
        f"for i in $(seq 100); do [ -e /proc/{pid} ] || break; sleep 0.05; done; "
        f"[ -e /proc/{pid} ] && echo alive || echo gone",
        language=RAW,
    )
    assert r["stdout"] == b"gone\n", r


def test_prestarted_javascript_ends_like_the_script_run(a: Agent) -> None:
    for req_id, code in (
        (
            70,
            "process.on('exit', (c) => console.log('exit', c));"
            " setTimeout(() => console.log('later'), 50); process.exitCode = 6;",
        ),
        (72, "process.on('exit', () => console.log('exit')); null.x;"),
        (74, "Promise.reject(new Error('nobody caught me'));"),
        (
            76,
            "process.on('uncaughtException', (e) => console.log('handled', e.message));"
            " setTimeout(() => { throw new Error('late'); }, 10);",
        ),
    ):
        cold = a.run(req_id, code, language=JAVASCRIPT)
        prestart(a, req_id + 100, JAVASCRIPT)
        warm = a.run(req_id + 1, code, language=JAVASCRIPT)
        assert (warm["stdout"], warm["exit"]) == (cold["stdout"], cold["exit"]), (cold, warm)
        # Node's own entry point runs the script after the preload: the same stack trace.
        assert warm["stderr"] == cold["stderr"], (cold, warm)
        if req_id == 70:
            assert (warm["stdout"], warm["exit"]) == (b"later\nexit 6\n", 6), warm
        if req_id == 72:
            assert warm["exit"] == 1 and b"TypeError" in warm["stderr"], warm


def test_prestarted_bash_runs_the_script_like_bash_does(a: Agent) -> None:
    code = (
        'echo "$0 $# ${BASH_SOURCE[0]} $LINENO"\nexec 3>/dev/null\necho to-3 >&3\n'
        "no_such_command\necho err >&2\n(exit 4)"
    )
    cold = a.run(80, code, language=RAW)
    prestart(a, 81, RAW)
    warm = a.run(82, "head -c 8 /proc/$$/cmdline | tr '\\0' ' '; echo; " + code, language=RAW)
    assert warm["stdout"].startswith(b"bash -c "), warm  # the pre-started shell ran it
    assert (warm["stdout"][warm["stdout"].index(b"\n") + 1 :], warm["stderr"], warm["exit"]) == (
        cold["stdout"],
        cold["stderr"],
        cold["exit"],
    ), (cold, warm)
    assert cold["exit"] == 4 and cold["stdout"].endswith(b"/main.sh 1\n"), cold
    # `exit` ends the shell before the bootstrap can report: the run ends by its death instead.
    prestart(a, 83, RAW)
    r = a.run(84, "echo bye; exit 9", language=RAW)
    assert (r["stdout"], r["exit"]) == (b"bye\n", 9), r


def test_prestart_refusals(a: Agent) -> None:
    for req_id, payload in ((47, b"\x00"), (48, b""), (49, bytes([PYTHON, 0])), (50, b"\x09")):
        a.send(frame(PRESTART, req_id, payload))
        mtype, fid, reply = a.expect()
        assert (mtype, fid) == (ERROR, req_id), (mtype, fid, reply)
        assert decode_error(reply)[0] == ERR_BAD_REQUEST
    # Busy while a run is in progress.
    a.send(frame(EXEC, 51, exec_payload("sleep 0.3")))
    time.sleep(0.1)
    a.send(frame(PRESTART, 52, bytes([PYTHON])))
    mtype, fid, reply = a.expect()
    assert (mtype, fid, decode_error(reply)[0]) == (ERROR, 52, ERR_BUSY), reply
    assert a.collect(51)["exit"] == 0


SHARED = [
    test_ready_and_ping,
    test_bash_stdout_stderr_exit_code,
    test_killed_by_signal_is_128_plus_n,
    test_timeout,
    test_timeout_none_lets_the_code_run_until_it_ends,
    test_timeout_ignoring_sigterm_gets_sigkill,
    test_stdout_limit,
    test_stderr_limit,
    test_output_exactly_at_limit_is_whole,
    test_timeout_enforced_while_host_not_reading,
    test_output_complete_when_host_lags_at_exit,
    test_python_env_and_cwd,
    test_clean_environment,
    test_javascript,
    test_fds_and_session,
    test_busy,
    test_escaped_daemon_does_not_hold_the_exit,
    test_orphans_are_reaped,
    test_large_code,
    test_bad_requests_keep_the_stream,
    test_prestarted_python_serves_the_next_exec,
    test_prestarted_python_matches_the_script_run,
    test_prestarted_process_is_not_used_for_env_or_other_languages,
    test_prestarted_javascript,
    test_prestarted_python_reports_its_end_before_the_teardown,
    test_prestarted_javascript_ends_like_the_script_run,
    test_prestarted_bash_runs_the_script_like_bash_does,
    test_prestart_refusals,
]
# Each of these leaves the agent unable to read: one fresh agent per test.
STICKY = [test_broken_framing_is_sticky, test_oversized_frame_is_refused]
STANDALONE = [
    test_spawn_failure,
    test_hangup_kills_the_run_and_exits,
    test_user_code_runs_sched_batch_from_the_agents_sched_other,
]


# --- sessions and files (standalone: each gets an agent with the REPL drivers) ------------------


def session_agent() -> Agent:
    a = Agent("--driver-dir", DRIVERS)
    assert a.expect()[0] == READY
    return a


def session_run(a: Agent, req_id: int, code: str, **kw) -> dict:
    a.send(frame(SESSION_EXEC, req_id, exec_payload(code, **kw)))
    return a.collect(req_id, 60)


def file_reply(a: Agent, req_id: int) -> tuple[int, bytes, list]:
    """(FILE_DONE value or -error kind, data, entries) for one request."""
    data, entries = b"", []
    while True:
        mtype, fid, payload = a.expect(10)
        assert fid == req_id, (mtype, fid)
        if mtype == FILE_DATA:
            data += payload
        elif mtype == FILE_ENTRIES:
            (count,), off = struct.unpack_from("<I", payload), 4
            for _ in range(count):
                is_dir, size, n = struct.unpack_from("<BQI", payload, off)
                off += 13
                entries.append((payload[off : off + n].decode(), is_dir, size))
                off += n
        elif mtype == FILE_DONE:
            return struct.unpack("<Q", payload)[0], data, entries
        elif mtype == FILE_ERROR:
            return -struct.unpack_from("<I", payload)[0], data, entries
        else:
            raise AssertionError(f"unexpected frame {mtype}")


def test_session_state_survives_errors_and_timeout_resets_it() -> None:
    a = session_agent()
    try:
        r = session_run(a, 1, "x = 41", language=PYTHON, timeout_ms=60_000)
        assert r["exit"] == 0, r
        r = session_run(a, 2, "raise KeyError('k')", language=PYTHON)
        assert r["exit"] == 1 and b"KeyError" in r["stderr"], r
        r = session_run(a, 3, "import sys; print(x + 1); sys.exit(4)", language=PYTHON)
        assert (r["exit"], r["stdout"]) == (4, b"42\n"), r
        r = session_run(a, 4, "while True: pass", language=PYTHON, timeout_ms=500)
        assert (r["exit"], r["flags"]) == (-1, TIMED_OUT | REPL_RESET), r
        r = session_run(a, 5, "print('x' in globals())", language=PYTHON, timeout_ms=60_000)
        assert r["stdout"] == b"False\n", r
        # Another language while the REPL lives is refused, the REPL stays.
        r = session_run(a, 6, "echo no", language=RAW)
        assert r.get("error") == ERR_BAD_REQUEST, r
        r = session_run(a, 7, "import os; os.write(1, b'\\x04\\x00' * 8); print()", language=PYTHON)
        assert (r["exit"], r["stdout"]) == (0, b"\x04\x00" * 8 + b"\n"), r
    finally:
        assert a.close() == 0


def test_session_output_limit_interrupts_but_keeps_state() -> None:
    a = session_agent()
    try:
        assert session_run(a, 1, "y = 5", language=PYTHON, timeout_ms=60_000)["exit"] == 0
        r = session_run(
            a,
            2,
            "while True: print('z' * 1000)",
            language=PYTHON,
            stdout_limit=10_000,
            timeout_ms=20_000,
        )
        assert r["flags"] == STDOUT_LIMIT and len(r["stdout"]) == 10_000, r["flags"]
        r = session_run(a, 3, "print(y)", language=PYTHON)
        assert r["stdout"] == b"5\n", r
    finally:
        assert a.close() == 0


FORGE_PY = """
import os, time
for fd in map(int, os.listdir('/proc/self/fd')):
    if fd > 2:
        for line in [b'0\\n'] + [b'%d 0\\n' % seq for seq in range(64)] + [b'zz']:
            try:
                os.write(fd, line)
            except OSError:
                pass
time.sleep(0.3)
print('late')
raise SystemExit(3)
"""


FORGE_JS = """
const fs = require('fs');
// fds 3 and 4 only (the driver's control fds when spawned; the socket on 3 when adopted):
// writing into libuv's own fds would only crash this REPL.
for (const fd of [3, 4]) {
  for (const line of ['0\\n', ...Array.from({length: 64}, (_, seq) => `${seq} 0\\n`), 'zz']) {
    try { fs.writeSync(fd, line); } catch (e) { /* not writable */ }
  }
}
await new Promise((resolve) => setTimeout(resolve, 300));
console.log('late');
process.exit(3);
"""


def test_session_adopts_the_prestarted_node() -> None:
    # A waiting node becomes the session's REPL driver (repl.h, sbx_repl_adopt): the code runs in
    # that process (argv[1] "-r": the pre-start preload) as in a driver started for it (no hooks
    # of the bootstrap left, the driver's argv), state persists, and the one control socket, which
    # its code can write to, ends no request with a forged completion line.
    a = session_agent()
    try:
        prestart(a, 1, JAVASCRIPT)
        who = (
            "console.log(require('fs').readFileSync('/proc/self/cmdline', 'latin1').split('\\0')[1],"  # noqa: E501
            " process.argv[1].endsWith('/driver.js'),"
            " process.listenerCount('uncaughtExceptionMonitor'),"
            " Symbol.for('sbx.control-out') in process);"
        )
        r = session_run(a, 2, "let kept = 41;\n" + who, language=JAVASCRIPT, timeout_ms=30_000)
        assert (r["exit"], r["stdout"], r["stderr"]) == (0, b"-r true 0 false\n", b""), r
        r = session_run(a, 3, FORGE_JS, language=JAVASCRIPT, timeout_ms=30_000)
        assert (r["exit"], r["stdout"]) == (3, b"late\n"), r
        # A worker thread (which gets node's preloads too) reads nothing off the socket.
        r = session_run(
            a,
            4,
            "const { Worker } = require('worker_threads');\n"
            "await new Promise((resolve) => new Worker('1', { eval: true })"
            ".on('exit', resolve));\nconsole.log('worker done');",
            language=JAVASCRIPT,
            timeout_ms=30_000,
        )
        assert (r["exit"], r["stdout"], r["stderr"]) == (0, b"worker done\n", b""), r
        r = session_run(
            a, 5, "console.log(kept + 1); process.exit(5)", language=JAVASCRIPT, timeout_ms=30_000
        )
        assert (r["exit"], r["stdout"], r["stderr"]) == (5, b"42\n", b""), r
    finally:
        assert a.close() == 0


def test_session_forged_completion_neither_ends_nor_shifts_results() -> None:
    # The code writes well-formed completion lines for every plausible request number to every
    # fd it has: its exec still ends with its own status and output, and the next is clean.
    a = session_agent()
    try:
        assert session_run(a, 1, "kept = 1", language=PYTHON, timeout_ms=30_000)["exit"] == 0
        r = session_run(a, 2, FORGE_PY, language=PYTHON, timeout_ms=30_000)
        assert (r["exit"], r["stdout"]) == (3, b"late\n"), r
        r = session_run(a, 3, "print('next', kept)", language=PYTHON, timeout_ms=30_000)
        assert (r["exit"], r["stdout"], r["stderr"]) == (0, b"next 1\n", b""), r
    finally:
        assert a.close() == 0


def test_session_background_output_never_reaches_a_later_result() -> None:
    a = session_agent()
    try:
        ghost = (
            "(for i in $(seq 1 40); do echo GHOST $i; echo GHOSTERR $i >&2; sleep 0.05;"
            " done) & echo started"
        )
        r = session_run(a, 1, ghost, language=RAW, timeout_ms=30_000)
        assert r["exit"] == 0 and r["stdout"].startswith(b"started\n"), r
        r = session_run(a, 2, "sleep 1; echo clean", language=RAW, timeout_ms=30_000)
        assert (r["exit"], r["stdout"], r["stderr"]) == (0, b"clean\n", b""), r
    finally:
        assert a.close() == 0


def test_session_copies_of_stdout_kept_by_the_code_do_not_hold_the_exec() -> None:
    # A copy of stdout that outlives its exec is pointed at /dev/null by the driver: the exec
    # ends, and nothing written through it later reaches another result.
    a = session_agent()
    try:
        r = session_run(a, 1, "exec 5>&1; echo a", language=RAW, timeout_ms=30_000)
        assert (r["exit"], r["stdout"]) == (0, b"a\n"), r
        r = session_run(a, 2, "echo b >&5; echo c", language=RAW, timeout_ms=30_000)
        assert (r["exit"], r["stdout"]) == (0, b"c\n"), r
    finally:
        assert a.close() == 0


def test_files_write_read_list_and_refusals() -> None:
    a = session_agent()
    home = os.path.join(a.work.name, "home")
    try:
        data = bytes(range(256)) * 1000
        a.send(frame(WRITE_BEGIN, 1, s("d/e/f.bin") + b"\x01"))
        for i in range(0, len(data), 70_000):
            a.send(frame(WRITE_DATA, 1, data[i : i + 70_000]))
        a.send(frame(WRITE_END, 1, b"\x01"))
        assert file_reply(a, 1)[0] == len(data)
        assert os.access(os.path.join(home, "d/e/f.bin"), os.X_OK)
        a.send(frame(FILE_READ, 2, s("d/e/f.bin") + b"\x00"))
        n, back, _ = file_reply(a, 2)
        assert n == len(data) and back == data
        a.send(frame(FILE_LIST, 3, s("d/e")))
        assert file_reply(a, 3) == (1, b"", [("f.bin", 0, len(data))])
        # An aborted write leaves nothing, not even its temporary file.
        a.send(frame(WRITE_BEGIN, 4, s("d/gone.txt") + b"\x00") + frame(WRITE_DATA, 4, b"x"))
        a.send(frame(WRITE_END, 4, b"\x00"))
        a.send(frame(FILE_LIST, 5, s("d")))
        assert [e[0] for e in file_reply(a, 5)[2]] == ["e"]
        # The guest refuses what the host should have: '..', absolute, empty components.
        for i, bad in enumerate(["../x", "/etc/passwd", "a//b", ".", "a/.."]):
            a.send(frame(FILE_READ, 10 + i, s(bad) + b"\x00"))
            assert file_reply(a, 10 + i)[0] == -FILE_ERR_PATH, bad
        # Symlinks are never followed, wherever they are on the path.
        os.symlink("/etc", os.path.join(home, "etc"))
        os.symlink("/etc/hostname", os.path.join(home, "hostname"))
        for i, path in enumerate(["etc/hostname", "hostname"]):
            a.send(frame(FILE_READ, 20 + i, s(path) + b"\x00"))
            assert file_reply(a, 20 + i)[0] == -FILE_ERR_PATH, path
        a.send(frame(WRITE_BEGIN, 22, s("etc/planted") + b"\x00"))
        assert file_reply(a, 22)[0] == -FILE_ERR_PATH
        a.send(frame(WRITE_END, 22, b"\x01"))  # clears the failed write; no reply
        a.send(frame(FILE_READ, 23, s("missing") + b"\x00"))
        assert file_reply(a, 23)[0] == -FILE_ERR_NOT_FOUND
        a.send(frame(WRITE_DATA, 24, b"orphan"))
        assert file_reply(a, 24)[0] == -FILE_ERR_PROTOCOL
        a.send(frame(PING, 25))
        assert a.expect() == (PONG, 25, b"")
    finally:
        assert a.close() == 0


def test_files_node_snapshot_slot_takes_only_its_own_cpu_tag() -> None:
    # Node's startup snapshot is named by a flag, never a path (protocol.h); it is read out led
    # by the guest's CPU tag, and taken in only behind that same tag.
    a = session_agent()
    slot = os.path.join(a.work.name, "node-startup.blob")
    try:
        a.send(frame(FILE_READ, 1, s("") + bytes([FILE_NODE_SNAPSHOT])))
        assert file_reply(a, 1)[0] == -FILE_ERR_NOT_FOUND
        with open(slot, "wb") as f:
            f.write(b"blob made in the guest")
        a.send(frame(FILE_READ, 2, s("") + bytes([FILE_NODE_SNAPSHOT])))
        n, data, _ = file_reply(a, 2)
        tag, blob = data[:NODE_TAG_SIZE], data[NODE_TAG_SIZE:]
        assert n == len(data) and blob == b"blob made in the guest", data
        assert tag.startswith(b"sbxcpu01") and tag != bytes(NODE_TAG_SIZE)

        def write(
            req_id: int, content: bytes, flags: int = FILE_NODE_SNAPSHOT, path: str = ""
        ) -> int:
            a.send(frame(WRITE_BEGIN, req_id, s(path) + bytes([flags])))
            for i in range(0, len(content), 5):  # the tag split across frames
                a.send(frame(WRITE_DATA, req_id, content[i : i + 5]))
            a.send(frame(WRITE_END, req_id, b"\x01"))
            return file_reply(a, req_id)[0]

        assert write(3, tag + b"from the host") == NODE_TAG_SIZE + len(b"from the host")
        with open(slot, "rb") as f:
            assert f.read() == b"from the host"
        other = bytearray(tag)
        other[20] ^= 1  # another CPU's features
        assert write(4, bytes(other) + b"stale") == -FILE_ERR_REFUSED
        assert write(5, tag[:10]) == -FILE_ERR_REFUSED  # no whole tag: no blob
        assert write(6, tag + b"x", FILE_NODE_SNAPSHOT | 1) == -FILE_ERR_PROTOCOL
        assert write(7, tag + b"x", FILE_NODE_SNAPSHOT, "f.blob") == -FILE_ERR_PROTOCOL
        assert write(8, tag + b"x", 4) == -FILE_ERR_PROTOCOL
        with open(slot, "rb") as f:
            assert f.read() == b"from the host"  # refused writes left it alone...
        assert not [n for n in os.listdir(a.work.name) if n.startswith(".sbx-upload")]
        os.unlink(slot)
        os.symlink("/etc/hostname", slot)  # ...and a link there is never followed
        a.send(frame(FILE_READ, 9, s("") + bytes([FILE_NODE_SNAPSHOT])))
        assert file_reply(a, 9)[0] == -FILE_ERR_PATH
        a.send(frame(FILE_READ, 10, s("x") + bytes([FILE_NODE_SNAPSHOT])))
        assert file_reply(a, 10)[0] == -FILE_ERR_PROTOCOL
    finally:
        assert a.close() == 0


# --- host socket (docs/protocol.md, "Host tools and rich outputs") -------------------------------

LOCAL_CALL, LOCAL_OUTPUT, LOCAL_REPLY = 1, 2, 3
TOOL_CALL, OUTPUT, TOOL_RESULT = 11, 12, 72
OUTPUT_BEGIN, OUTPUT_END = 1, 2
TOOL_OK, TOOL_ERROR, TOOL_REFUSED = 0, 1, 2
TOOL_CALLS_MAX, OUTPUTS_MAX = 16, 32
OUTPUT_DATA_MAX, OUTPUT_ITEM_MAX = 60 * 1024, 4 * 1024 * 1024
TOOL_RESULT_MAX = 1024 * 1024
ARGS = b'{"args": [1, 2], "kwargs": {}}'


def host_socket_path(a: Agent) -> str:
    return os.path.join(a.work.name, "run", "host.sock")


class Client:
    """A process of user code on the host socket: frames of the channel's format."""

    def __init__(self, a: Agent) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(host_socket_path(a))
        self.buf = b""

    def call(self, rid: int, name: str | bytes, args: bytes = ARGS) -> None:
        self.sock.sendall(frame(LOCAL_CALL, rid, s(name) + s(args)))

    def output(self, rid: int, mime: str | bytes, data: bytes) -> None:
        self.sock.sendall(frame(LOCAL_OUTPUT, rid, s(mime) + data))

    def reply(self, timeout: float = 5.0) -> tuple[int, int, bytes] | None:
        """(id, status, body) of the next LOCAL_REPLY; None on timeout or the end."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= HEADER.size:
                length, t, flags, reserved, rid = HEADER.unpack_from(self.buf)
                assert (t, flags, reserved) == (LOCAL_REPLY, 0, 0), (t, flags, reserved)
                if len(self.buf) >= HEADER.size + length:
                    p = self.buf[HEADER.size : HEADER.size + length]
                    self.buf = self.buf[HEADER.size + length :]
                    n = struct.unpack_from("<I", p, 1)[0]
                    assert len(p) == 5 + n, "malformed LOCAL_REPLY"
                    return rid, p[0], p[5:]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return None
            self.buf += chunk

    def refused(self, rid: int, reason: str) -> None:
        r = self.reply()
        assert r is not None and r[:2] == (rid, TOOL_REFUSED) and reason in r[2].decode(), r

    def closed_by_agent(self, timeout: float = 5.0) -> bool:
        if not select.select([self.sock], [], [], timeout)[0]:
            return False
        try:
            return self.sock.recv(1 << 16) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def start_exec(a: Agent, exec_id: int, code: str, msg_type: int = EXEC) -> None:
    """Start code and return once it runs (the PONG comes after the EXEC is handled)."""
    a.send(frame(msg_type, exec_id, exec_payload(code)))
    a.send(frame(PING, exec_id + 5000))
    assert a.expect() == (PONG, exec_id + 5000, b"")


def expect_tool_call(a: Agent, exec_id: int) -> tuple[int, str, bytes]:
    t, fid, p = a.expect()
    assert (t, fid) == (TOOL_CALL, exec_id), (t, fid, p[:64])
    call, n = struct.unpack_from("<II", p)
    name = p[8 : 8 + n].decode()
    (m,) = struct.unpack_from("<I", p, 8 + n)
    assert len(p) == 12 + n + m and call != 0, "malformed TOOL_CALL"
    return call, name, p[12 + n :]


def tool_result(a: Agent, exec_id: int, call: int, status: int, body: bytes) -> None:
    a.send(frame(TOOL_RESULT, exec_id, struct.pack("<IB", call, status) + s(body)))


def expect_output(a: Agent, exec_id: int) -> tuple[str, bytes, list[int]]:
    """One whole output from the channel: (mime type, data, size of each frame's data)."""
    mime, data, sizes = None, b"", []
    while True:
        t, fid, p = a.expect()
        assert (t, fid) == (OUTPUT, exec_id), (t, fid, p[:64])
        flags, off = p[0], 1
        assert flags & ~(OUTPUT_BEGIN | OUTPUT_END) == 0, flags
        assert bool(flags & OUTPUT_BEGIN) == (mime is None), "BEGIN only on the first frame"
        if flags & OUTPUT_BEGIN:
            (n,) = struct.unpack_from("<I", p, 1)
            mime, off = p[5 : 5 + n].decode(), 5 + n
        chunk = p[off:]
        assert len(chunk) <= OUTPUT_DATA_MAX, len(chunk)
        data += chunk
        sizes.append(len(chunk))
        if flags & OUTPUT_END:
            return mime, data, sizes


def test_host_socket_calls() -> None:
    """LOCAL_CALL -> TOOL_CALL with the running exec's id -> TOOL_RESULT -> LOCAL_REPLY; the
    refusals (no execution, malformed, 16 in flight) and the end of the execution answering the
    calls still open."""
    a = Agent()
    clients: list[Client] = []
    try:
        assert a.expect()[0] == READY
        st = os.stat(host_socket_path(a))
        assert (st.st_mode & 0o777) == 0o666, oct(st.st_mode)
        c = Client(a)
        clients.append(c)
        c.call(1, "add")
        c.refused(1, "no execution")

        start_exec(a, 40, "sleep 3")
        c.call(2, "add")
        call, name, args = expect_tool_call(a, 40)
        assert (name, args) == ("add", ARGS)
        tool_result(a, 40, call, TOOL_OK, b"3")
        assert c.reply() == (2, TOOL_OK, b"3")
        # Empty arguments are no JSON, and the host's decoder would take them for a broken
        # agent and end the VM: refused here.
        c.call(3, "fails", b"")
        c.refused(3, "empty tool arguments")
        c.call(3, "fails", b"[]")
        call3, _, args = expect_tool_call(a, 40)
        assert args == b"[]" and call3 != call
        tool_result(a, 40, call3, TOOL_ERROR, b"ValueError: no")
        assert c.reply() == (3, TOOL_ERROR, b"ValueError: no")

        # Malformed requests: refused with their reason, the connection goes on.
        c.call(4, "1abc")
        c.refused(4, "invalid tool name")
        c.call(5, "a-b")
        c.refused(5, "invalid tool name")
        c.call(6, "")
        c.refused(6, "invalid tool name")
        c.call(7, "x" * 65)
        c.refused(7, "tool name too long")
        c.call(8, "ok", b'{"args": ["\xff"]}')
        c.refused(8, "UTF-8")
        c.call(9, "ok", b" " * (60 * 1024 + 1))
        c.refused(9, "too long")
        c.sock.sendall(frame(LOCAL_CALL, 10, s("ok") + s(ARGS) + b"x"))
        c.refused(10, "trailing")
        c.sock.sendall(frame(LOCAL_REPLY, 11, b"\0" + s("")))
        c.refused(11, "unknown request type")
        c.call(12, "ok", b'{"args": ["\xc3\xa9"], "kwargs": {}}')  # UTF-8 passes
        call12, name, _ = expect_tool_call(a, 40)
        assert name == "ok"
        # A malformed TOOL_RESULT and one for no call are ignored.
        a.send(frame(TOOL_RESULT, 40, struct.pack("<IB", call12, 7) + s(b"x")))
        tool_result(a, 40, 0xFFFF0000, TOOL_OK, b"1")
        tool_result(a, 41, call12, TOOL_OK, b"1")  # another execution's id
        assert c.reply(0.3) is None

        # 16 in flight across connections (call 12 is one), the 17th refused.
        d = Client(a)
        clients.append(d)
        calls = {call12}
        for rid in range(100, 100 + TOOL_CALLS_MAX - 1):
            d.call(rid, "slow")
            calls.add(expect_tool_call(a, 40)[0])
        assert len(calls) == TOOL_CALLS_MAX and 0 not in calls
        d.call(200, "slow")
        d.refused(200, "in flight")
        tool_result(a, 40, call12, TOOL_OK, b"12")
        assert c.reply() == (12, TOOL_OK, b"12")
        d.call(201, "slow")  # a place came free
        calls.discard(call12)
        calls.add(expect_tool_call(a, 40)[0])
        # A client that left does not take its result, nor its place away forever.
        c.close()

        # The end of the execution answers every call still open.
        r = a.collect(40)
        assert r["exit"] == 0, r
        got = {}
        for _ in range(TOOL_CALLS_MAX):
            rid, status, body = d.reply()
            got[rid] = (status, body)
        assert set(got) == set(range(100, 100 + TOOL_CALLS_MAX - 1)) | {201}, got
        assert all(v == (TOOL_REFUSED, b"the execution ended") for v in got.values()), got
        for call in calls:  # late results: dropped
            tool_result(a, 40, call, TOOL_OK, b"late")
        assert d.reply(0.3) is None
        d.call(300, "add")
        d.refused(300, "no execution")
        a.send(frame(PING, 41))
        assert a.expect() == (PONG, 41, b"")
    finally:
        for cl in clients:
            cl.close()
        assert a.close() == 0


def test_host_socket_outputs() -> None:
    """LOCAL_OUTPUT -> OUTPUT frames (BEGIN with the type ... END, data <= 60 KiB each) queued
    before the reply and before the EXIT; mime type checks; 32 outputs and 16 MiB per execution,
    reset by the next one."""
    a = Agent()
    c = None
    try:
        assert a.expect()[0] == READY
        c = Client(a)
        start_exec(a, 50, "sleep 1")
        data = os.urandom(200 * 1024)
        c.output(1, "image/png", data)
        assert c.reply() == (1, TOOL_OK, b"")
        c.output(2, "text/html", b"")
        assert c.reply() == (2, TOOL_OK, b"")
        c.output(3, "application/vnd.custom+json", b"{}")
        assert c.reply() == (3, TOOL_OK, b"")
        for rid, mime in enumerate(
            ["image", "Image/png", "a/b/c", "/png", "image/", "", "im age/png", "x/" + "y" * 126]
        ):
            c.output(10 + rid, mime, b"data")
            c.refused(10 + rid, "mime type")
        # Everything the replies acknowledged is on the channel, in order, before the EXIT.
        assert expect_output(a, 50) == ("image/png", data, [OUTPUT_DATA_MAX] * 3 + [20 * 1024])
        assert expect_output(a, 50) == ("text/html", b"", [0])
        assert expect_output(a, 50) == ("application/vnd.custom+json", b"{}", [2])
        r = a.collect(50)
        assert r["exit"] == 0, r

        c.output(20, "text/plain", b"late")
        c.refused(20, "no execution")

        # 32 outputs per execution; the count starts again with the next one.
        for exec_id in (51, 52):
            start_exec(a, exec_id, "sleep 1")
            for rid in range(OUTPUTS_MAX):
                c.output(rid, "text/plain", b"%d" % rid)
                assert c.reply() == (rid, TOOL_OK, b"")
                assert expect_output(a, exec_id) == ("text/plain", b"%d" % rid, [len(b"%d" % rid)])
            c.output(99, "text/plain", b"one more")
            c.refused(99, "too many outputs")
            a.send(frame(PING, 1000 + exec_id))
            assert a.expect() == (PONG, 1000 + exec_id, b"")  # nothing was queued
            assert a.collect(exec_id)["exit"] == 0

        # 16 MiB per execution: four outputs of 4 MiB, then not one byte more.
        start_exec(a, 53, "sleep 3")
        big = os.urandom(OUTPUT_ITEM_MAX)
        for rid in range(4):
            c.output(rid, "application/octet-stream", big)
            mime, got, sizes = expect_output(a, 53)
            assert got == big and max(sizes) == OUTPUT_DATA_MAX, sizes[-3:]
            assert c.reply() == (rid, TOOL_OK, b"")
        c.output(4, "text/plain", b"x")
        c.refused(4, "16 MiB")
        c.output(5, "text/plain", b"x" * (OUTPUT_ITEM_MAX + 1))
        c.refused(5, "too large")
        assert a.collect(53)["exit"] == 0
    finally:
        if c:
            c.close()
        assert a.close() == 0


def test_host_socket_connections() -> None:
    """At most 16 clients (the 17th is closed at once); a broken header or an oversized frame
    costs only that connection; a client that sends a 4 MiB output in small pieces while others
    call is served in turn."""
    a = Agent()
    clients: list[Client] = []
    try:
        assert a.expect()[0] == READY
        clients = [Client(a) for _ in range(16)]
        for i, cl in enumerate(clients):
            cl.call(i, "x")
            cl.refused(i, "no execution")
        extra = Client(a)
        assert extra.closed_by_agent()
        extra.close()
        bad = clients.pop()
        bad.sock.sendall(HEADER.pack(0, LOCAL_CALL, 1, 0, 1))  # non-zero flags
        assert bad.closed_by_agent()
        bad.close()
        bad = clients.pop()
        bad.sock.sendall(HEADER.pack(OUTPUT_ITEM_MAX + 4096 + 1, LOCAL_OUTPUT, 0, 0, 1))
        assert bad.closed_by_agent()
        bad.close()
        # Their places are free again.
        clients += [Client(a), Client(a)]
        start_exec(a, 60, "sleep 4")
        big = os.urandom(OUTPUT_ITEM_MAX)
        req = frame(LOCAL_OUTPUT, 7, s("image/png") + big)

        # Two large outputs at once, sent in two halves, and a call on a third client
        # meanwhile: one output is taken in while the other waits (its sender blocks), and the
        # call goes by both.
        def send_slowly(cl: Client) -> None:
            cl.sock.sendall(req[: len(req) // 2])
            time.sleep(0.3)
            cl.sock.sendall(req[len(req) // 2 :])

        senders = [threading.Thread(target=send_slowly, args=(cl,)) for cl in clients[:2]]
        for t in senders:
            t.start()
        time.sleep(0.1)
        clients[2].call(8, "quick")
        call, _, _ = expect_tool_call(a, 60)
        tool_result(a, 60, call, TOOL_OK, b"1")
        assert clients[2].reply() == (8, TOOL_OK, b"1")
        for _ in range(2):
            assert expect_output(a, 60)[:2] == ("image/png", big)
        for t in senders:
            t.join(timeout=10)
        for cl in clients[:2]:
            assert cl.reply() == (7, TOOL_OK, b"")
        assert a.collect(60)["exit"] == 0
    finally:
        for cl in clients:
            cl.close()
        assert a.close() == 0


def test_host_socket_unread_results_bound_the_agents_memory() -> None:
    """Clients that call and never read their replies: the agent takes a new call only while
    every connection's unread replies, with what the calls in flight may still bring, stay
    within 17 results of 1 MiB, so 16 such clients cannot hold 16 times that in PID 1."""
    a = Agent()
    clients: list[Client] = []
    try:
        assert a.expect()[0] == READY
        start_exec(a, 80, "sleep 8")
        hog = Client(a)
        clients.append(hog)
        for rid in range(TOOL_CALLS_MAX):
            hog.call(rid, "big")
        calls = [expect_tool_call(a, 80)[0] for _ in range(TOOL_CALLS_MAX)]
        body = b'"' + b"x" * (TOOL_RESULT_MAX - 2) + b'"'
        for call in calls:
            tool_result(a, 80, call, TOOL_OK, body)
        a.send(frame(PING, 81))
        assert a.expect() == (PONG, 81, b"")  # every result handled, none read by the hog
        # 16 MiB wait unread: another client's calls are taken only as far as the rest of the
        # budget (and what the hog's socket buffer took) goes, the others refused at once.
        other = Client(a)
        clients.append(other)
        for rid in range(100, 100 + TOOL_CALLS_MAX):
            other.call(rid, "big")
        refused = 0
        while (r := other.reply(0.5)) is not None:
            assert r[1] == TOOL_REFUSED and b"wait unread" in r[2], r
            refused += 1
        assert refused >= TOOL_CALLS_MAX - 3, refused
        for _ in range(TOOL_CALLS_MAX - refused):
            call, _, _ = expect_tool_call(a, 80)
            tool_result(a, 80, call, TOOL_OK, b"0")
        for _ in range(TOOL_CALLS_MAX - refused):
            assert other.reply() is not None
        # Once the hog reads its results, calls are taken again.
        for rid in range(TOOL_CALLS_MAX):
            r = hog.reply()
            assert r is not None and r[:2] == (rid, TOOL_OK) and len(r[2]) == len(body), r
        other.call(101, "big")
        call, name, _ = expect_tool_call(a, 80)
        tool_result(a, 80, call, TOOL_OK, b"1")
        assert other.reply() == (101, TOOL_OK, b"1")
        assert a.collect(80)["exit"] == 0
    finally:
        for cl in clients:
            cl.close()
        assert a.close() == 0


def test_host_socket_session_and_environment() -> None:
    """A session's request gets its calls under its own id; user code is told where the socket
    is when it is not at /run/sbx/host.sock (test mode)."""
    a = session_agent()
    c = None
    try:
        r = a.run(1, 'printf %s "$EXEC_SANDBOX_HOST_SOCKET"')
        assert r["stdout"].decode() == host_socket_path(a), r
        start_exec(a, 70, "sleep 2", SESSION_EXEC)
        c = Client(a)
        c.call(1, "tool")
        call, name, _ = expect_tool_call(a, 70)
        tool_result(a, 70, call, TOOL_OK, b"null")
        assert c.reply() == (1, TOOL_OK, b"null")
        assert a.collect(70)["exit"] == 0
    finally:
        if c:
            c.close()
        assert a.close() == 0


def main() -> int:
    global AGENT
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", default=AGENT)
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    AGENT = os.path.abspath(args.agent)
    failed = 0

    def report(name: str, fn) -> None:
        nonlocal failed
        if args.k not in name:
            return
        t0 = time.monotonic()
        try:
            fn()
            print(f"ok    {name} ({time.monotonic() - t0:.2f}s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {name}", flush=True)
            traceback.print_exc()

    a = Agent()
    try:
        mtype, fid, payload = a.expect()
        assert (mtype, fid) == (READY, 0) and payload[:4] == struct.pack("<I", 5), payload
        version = payload[8:].decode()
        assert version.startswith("sbx-agent "), version
        assert len(payload) == 8 + struct.unpack_from("<I", payload, 4)[0]
        for fn in SHARED:
            report(fn.__name__, lambda fn=fn: fn(a))
    finally:
        rc = a.close()
    if rc != 0:
        failed += 1
        print(f"FAIL  agent exit status {rc}")

    def fresh(fn):
        b = Agent()
        try:
            assert b.expect()[0] == READY
            fn(b)
        finally:
            assert b.close() == 0

    for fn in STICKY:
        report(fn.__name__, lambda fn=fn: fresh(fn))
    for fn in STANDALONE:
        report(fn.__name__, fn)
    for fn in (
        test_net_relay_in_test_mode,
        test_net_reattach_resets_the_old_streams,
        test_net_streams_share_a_backed_up_port,
        test_net_hung_up_stream_with_a_backed_up_port_does_not_spin,
        test_net_reused_slot_does_not_take_the_old_sockets_event,
    ):
        report(fn.__name__, fn)
    for fn in (
        test_session_state_survives_errors_and_timeout_resets_it,
        test_session_output_limit_interrupts_but_keeps_state,
        test_session_forged_completion_neither_ends_nor_shifts_results,
        test_session_adopts_the_prestarted_node,
        test_session_background_output_never_reaches_a_later_result,
        test_session_copies_of_stdout_kept_by_the_code_do_not_hold_the_exec,
        test_files_write_read_list_and_refusals,
        test_files_node_snapshot_slot_takes_only_its_own_cpu_tag,
        test_host_socket_calls,
        test_host_socket_outputs,
        test_host_socket_connections,
        test_host_socket_unread_results_bound_the_agents_memory,
        test_host_socket_session_and_environment,
    ):
        report(fn.__name__, fn)
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("chroot"):
        report("test_boot_in_namespaces", test_boot_in_namespaces)
    else:
        print("skip  test_boot_in_namespaces (needs root, unshare and chroot)")
    print("FAILED" if failed else "all passed", f"({failed} failures)" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
