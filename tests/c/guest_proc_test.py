#!/usr/bin/env python3
"""Host-side test of the guest agent's background processes and terminals (protocol.h,
"Processes"), with the agent in test mode as guest_agent_test.py runs it: frames over a
socketpair, user code as the caller's uid.

Usage: guest_proc_test.py [--agent PATH] [-k SUBSTRING]   (run by `make -C guest test`)
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import time
import traceback

import guest_agent_test as g
from guest_agent_test import ERROR, PING, PONG, Agent, decode_error, frame, s

# protocol.h
PROC_INFO, PROC_DATA = 13, 14
PROC_SPAWN, PROC_READ, PROC_WRITE, PROC_SIGNAL, PROC_WAIT, PROC_LIST, PROC_RESIZE = range(73, 80)
SPAWN_PTY = 1
RUNNING, PTY, STDIN_OPEN = 1, 2, 4
STDOUT, STDERR = 1, 2
DATA_EOF = 1
CLOSE_STDIN = 1
ERR_BAD_REQUEST, ERR_SPAWN, ERR_NO_PROCESS, ERR_LIMIT = 1, 3, 5, 6
PROC_MAX, TRACKED_MAX, PENDING_MAX = 128, 256, 64
BUFFER_MAX = 1024 * 1024
COMMAND_MAX = 128


def spawn_payload(
    argv: list[str | bytes],
    cwd: str = "",
    env: dict[str, str] | None = None,
    pty: tuple[int, int] | None = None,
) -> bytes:
    cols, rows = pty or (0, 0)
    out = struct.pack("<BHHI", SPAWN_PTY if pty else 0, cols, rows, len(argv))
    for a in argv:
        out += s(a)
    out += s(cwd) + struct.pack("<I", len(env or {}))
    for k, v in (env or {}).items():
        out += s(k) + s(v)
    return out


def decode_info(payload: bytes) -> list[dict]:
    (count,) = struct.unpack_from("<I", payload)
    off, out = 4, []
    for _ in range(count):
        pid, flags, code, nout, nerr, clen = struct.unpack_from("<IBiQQI", payload, off)
        off += struct.calcsize("<IBiQQI")
        assert clen <= COMMAND_MAX
        cmd = payload[off : off + clen]
        off += clen
        out.append({"pid": pid, "flags": flags, "exit": code, "out": nout, "err": nerr, "cmd": cmd})
    assert off == len(payload), "trailing bytes in PROC_INFO"
    return out


class P:
    """Request helpers over one agent; ids are unique per helper."""

    def __init__(self, a: Agent) -> None:
        self.a = a
        self.next_id = 1000
        self.early: dict[int, tuple[int, bytes]] = {}  # replies that came while waiting for another

    def rid(self) -> int:
        self.next_id += 1
        return self.next_id

    def reply(self, rid: int, timeout: float = 10.0) -> tuple[int, bytes]:
        if rid in self.early:
            return self.early.pop(rid)
        deadline = time.monotonic() + timeout
        while True:
            mtype, fid, payload = self.a.expect(max(0.0, deadline - time.monotonic()))
            if fid == rid:
                return mtype, payload
            self.early[fid] = (mtype, payload)

    def request(self, mtype: int, payload: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
        rid = self.rid()
        self.a.send(frame(mtype, rid, payload))
        return self.reply(rid, timeout)

    def spawn(self, argv: list[str | bytes], **kw) -> dict:  # type: ignore[no-untyped-def]
        mtype, payload = self.request(PROC_SPAWN, spawn_payload(argv, **kw))
        assert mtype == PROC_INFO, (mtype, payload)
        (info,) = decode_info(payload)
        return info

    def spawn_error(self, argv: list[str | bytes], **kw) -> tuple[int, str]:  # type: ignore[no-untyped-def]
        mtype, payload = self.request(PROC_SPAWN, spawn_payload(argv, **kw))
        assert mtype == ERROR, (mtype, payload)
        return decode_error(payload)

    def read(
        self, pid: int, stream: int = STDOUT, offset: int = 0, max_: int = 32768, wait_ms: int = 0
    ) -> tuple[int, int, bytes]:
        mtype, payload = self.request(
            PROC_READ, struct.pack("<IBQII", pid, stream, offset, max_, wait_ms)
        )
        assert mtype == PROC_DATA, (mtype, payload)
        start, flags = struct.unpack_from("<QB", payload)
        return start, flags, payload[9:]

    def read_all(self, pid: int, stream: int = STDOUT, timeout: float = 10.0) -> bytes:
        """Everything up to EOF, checking that offsets are contiguous (nothing dropped)."""
        out, off = b"", 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            start, flags, data = self.read(pid, stream, off, wait_ms=2000)
            assert start == off, (start, off)
            out += data
            off += len(data)
            if flags & DATA_EOF:
                return out
        raise AssertionError(f"no EOF; got {out!r}")

    def wait(self, pid: int, wait_ms: int = 10000) -> dict:
        mtype, payload = self.request(PROC_WAIT, struct.pack("<II", pid, wait_ms), 15)
        assert mtype == PROC_INFO, (mtype, payload)
        (info,) = decode_info(payload)
        return info

    def write(self, pid: int, data: bytes, flags: int = 0) -> tuple[int, bytes]:
        return self.request(PROC_WRITE, struct.pack("<IB", pid, flags) + data)

    def signal(self, pid: int, sig: int) -> tuple[int, bytes]:
        return self.request(PROC_SIGNAL, struct.pack("<II", pid, sig))

    def resize(self, pid: int, cols: int, rows: int) -> tuple[int, bytes]:
        return self.request(PROC_RESIZE, struct.pack("<IHH", pid, cols, rows))

    def list(self) -> list[dict]:
        mtype, payload = self.request(PROC_LIST, b"")
        assert mtype == PROC_INFO, (mtype, payload)
        return decode_info(payload)

    def read_until(
        self, pid: int, needle: bytes, offset: int = 0, timeout: float = 10.0
    ) -> tuple[bytes, int]:
        """Stdout from offset until it holds needle; returns (bytes, next offset)."""
        out = b""
        deadline = time.monotonic() + timeout
        while needle not in out:
            assert time.monotonic() < deadline, f"no {needle!r} in {out!r}"
            start, flags, data = self.read(pid, STDOUT, offset, wait_ms=1000)
            out += data
            offset = start + len(data)
            assert not (flags & DATA_EOF) or needle in out, f"EOF before {needle!r}: {out!r}"
        return out, offset


# --- tests ---------------------------------------------------------------------------------------


def test_spawn_read_wait_list(a: Agent) -> None:
    p = P(a)
    info = p.spawn(
        ["sh", "-c", 'echo out; echo err >&2; echo "$FOO" "$PWD"; exit 3'],
        env={"FOO": "bar"},
        cwd="/tmp",
    )
    assert info["flags"] & RUNNING and info["flags"] & STDIN_OPEN and not info["flags"] & PTY
    assert info["cmd"].startswith(b"sh -c echo out")
    assert p.read_all(info["pid"]) == b"out\nbar /tmp\n"
    assert p.read_all(info["pid"], STDERR) == b"err\n"
    done = p.wait(info["pid"])
    assert done["exit"] == 3 and not done["flags"] & RUNNING, done
    assert (done["out"], done["err"]) == (len(b"out\nbar /tmp\n"), 4)
    listed = {x["pid"]: x for x in p.list()}
    assert listed[info["pid"]]["exit"] == 3
    # The default working directory is an EXEC's (the home).
    info = p.spawn(["pwd"])
    assert p.read_all(info["pid"]).decode().strip() == os.path.join(a.work.name, "home")


def test_read_holds_until_data_and_times_out_empty(a: Agent) -> None:
    p = P(a)
    info = p.spawn(["sh", "-c", "sleep 0.5; echo late; sleep 30"])
    pid = info["pid"]
    t0 = time.monotonic()
    start, flags, data = p.read(pid, wait_ms=200)
    assert (start, flags, data) == (0, 0, b"") and time.monotonic() - t0 >= 0.15
    t0 = time.monotonic()
    start, flags, data = p.read(pid, wait_ms=10000)
    assert data == b"late\n" and time.monotonic() - t0 < 5, (data, time.monotonic() - t0)
    # A wait that passes its time: RUNNING and no exit code.
    info = p.wait(pid, wait_ms=100)
    assert info["flags"] & RUNNING and info["exit"] == 0
    assert p.signal(pid, 9)[0] == PONG
    assert p.wait(pid)["exit"] == 128 + 9
    # Ended: signals and writes are refused, reads still work.
    assert decode_error(p.signal(pid, 15)[1])[0] == ERR_NO_PROCESS
    assert decode_error(p.write(pid, b"x")[1])[0] == ERR_NO_PROCESS
    assert p.read(pid, offset=5, wait_ms=5000)[1] == DATA_EOF
    # An offset past the bytes produced is the host's bug.
    mtype, payload = p.request(PROC_READ, struct.pack("<IBQII", pid, STDOUT, 6, 10, 0))
    assert mtype == ERROR and decode_error(payload)[0] == ERR_BAD_REQUEST


def test_write_and_close_stdin(a: Agent) -> None:
    p = P(a)
    info = p.spawn(["cat"])
    pid = info["pid"]
    assert p.write(pid, b"hello ")[0] == PONG
    assert p.write(pid, b"world\n", CLOSE_STDIN)[0] == PONG
    assert p.read_all(pid) == b"hello world\n"
    assert p.wait(pid)["exit"] == 0
    assert not p.list()[-1]["flags"] & STDIN_OPEN
    # A write larger than the pipe is held until the reader took it; later writes queue behind.
    info = p.spawn(["sh", "-c", "sleep 0.3; wc -c"])
    pid = info["pid"]
    big = b"x" * 60 * 1024
    ids = []
    for _ in range(4):
        rid = p.rid()
        ids.append(rid)
        a.send(frame(PROC_WRITE, rid, struct.pack("<IB", pid, 0) + big))
    rid = p.rid()
    a.send(frame(PROC_WRITE, rid, struct.pack("<IB", pid, CLOSE_STDIN)))
    for r in [*ids, rid]:
        assert p.reply(r) == (PONG, b"")
    assert p.read_all(pid).strip() == str(4 * len(big)).encode()
    # stdin closed: a write is refused.
    assert decode_error(p.write(pid, b"x")[1])[0] == ERR_NO_PROCESS


def test_spawn_failures(a: Agent) -> None:
    p = P(a)
    code, msg = p.spawn_error(["no-such-program-sbx"])
    assert code == ERR_SPAWN and "No such file" in msg, msg
    code, msg = p.spawn_error(["true"], cwd="/no/such/dir")
    assert code == ERR_SPAWN and "chdir" in msg, msg
    code, msg = p.spawn_error(["/etc/passwd"])
    assert code == ERR_SPAWN and "Permission denied" in msg, msg
    for pid in (12345678, 1):
        mtype, payload = p.request(PROC_WAIT, struct.pack("<II", pid, 0))
        assert mtype == ERROR and decode_error(payload)[0] == ERR_NO_PROCESS


def test_bad_frames_are_bad_requests(a: Agent) -> None:
    p = P(a)
    good = spawn_payload(["true"])
    no_cwd_env = s("") + struct.pack("<I", 0)
    bad = [
        (PROC_SPAWN, b""),
        (PROC_SPAWN, good + b"x"),
        (PROC_SPAWN, good[:-1]),
        (PROC_SPAWN, bytes([2]) + good[1:]),  # unknown flag
        (PROC_SPAWN, spawn_payload([])),
        (PROC_SPAWN, spawn_payload([""])),
        (PROC_SPAWN, spawn_payload(["a\0b"])),
        (PROC_SPAWN, spawn_payload(["true"], cwd="relative")),
        (PROC_SPAWN, spawn_payload(["true"], env={"1X": "y"})),
        (PROC_SPAWN, spawn_payload(["true"], pty=(0, 24))),
        (PROC_SPAWN, spawn_payload(["true"], pty=(80, 1001))),
        (PROC_SPAWN, struct.pack("<BHHI", 0, 80, 24, 1) + s("true") + no_cwd_env),
        (PROC_SPAWN, struct.pack("<BHHI", 0, 0, 0, 257) + s("x") * 257 + no_cwd_env),
        (PROC_SPAWN, struct.pack("<BHHI", 0, 0, 0, 1) + s("x" * (128 * 1024 + 1)) + no_cwd_env),
        (PROC_READ, struct.pack("<IBQII", 1, 3, 0, 10, 0)),
        (PROC_READ, struct.pack("<IBQII", 1, 1, 0, 0, 0)),
        (PROC_READ, struct.pack("<IBQII", 1, 1, 0, 32769, 0)),
        (PROC_READ, struct.pack("<IBQII", 1, 1, 0, 10, 60001)),
        (PROC_READ, struct.pack("<IBQI", 1, 1, 0, 10)),
        (PROC_READ, struct.pack("<IBQII", 0, 1, 0, 10, 0)),
        (PROC_WRITE, struct.pack("<IB", 1, 2)),
        (PROC_WRITE, struct.pack("<IB", 1, 0) + b"x" * (60 * 1024 + 1)),
        (PROC_WRITE, struct.pack("<I", 1)),
        (PROC_SIGNAL, struct.pack("<II", 1, 0)),
        (PROC_SIGNAL, struct.pack("<II", 1, 65)),
        (PROC_SIGNAL, struct.pack("<IIB", 1, 9, 0)),
        (PROC_WAIT, struct.pack("<II", 1, 60001)),
        (PROC_WAIT, struct.pack("<I", 1)),
        (PROC_LIST, b"\0"),
        (PROC_RESIZE, struct.pack("<IHH", 1, 0, 24)),
        (PROC_RESIZE, struct.pack("<IHH", 1, 80, 1001)),
        (PROC_RESIZE, struct.pack("<IH", 1, 80)),
    ]
    for mtype, payload in bad:
        rtype, reply = p.request(mtype, payload)
        assert rtype == ERROR, (mtype, payload[:40], rtype)
        assert decode_error(reply)[0] == ERR_BAD_REQUEST, (mtype, payload[:40], reply)
    # The stream goes on.
    assert p.request(PING, b"") == (PONG, b"")


def test_ring_drops_oldest_with_an_offset_jump(a: Agent) -> None:
    p = P(a)
    total = 3 * BUFFER_MAX + 12345
    # Lines of 16 bytes: which were dropped shows in the first one kept.
    script = f"i=0; head -c {total} /dev/zero | tr '\\0' 'a'"
    info = p.spawn(["sh", "-c", script])
    pid = info["pid"]
    assert p.wait(pid)["exit"] == 0
    # Wait for the stream's EOF: the exit may come before the last bytes were read.
    deadline = time.monotonic() + 10
    while True:
        done = p.wait(pid, wait_ms=0)
        start, flags, data = p.read(pid, offset=done["out"], wait_ms=1000)
        if flags & DATA_EOF:
            break
        assert time.monotonic() < deadline
    assert p.wait(pid, wait_ms=0)["out"] == total
    start, flags, data = p.read(pid, offset=0, max_=100)
    assert start == total - BUFFER_MAX, (start, total - BUFFER_MAX)
    assert data == b"a" * 100 and not flags & DATA_EOF
    start, flags, data = p.read(pid, offset=total - 10)
    assert (start, flags, data) == (total - 10, DATA_EOF, b"a" * 10)


def test_flood_does_not_stop_pings(a: Agent) -> None:
    p = P(a)
    info = p.spawn(["yes"])
    pid = info["pid"]
    time.sleep(0.3)
    worst = 0.0
    for _ in range(20):
        t0 = time.monotonic()
        assert p.request(PING, b"", timeout=5) == (PONG, b"")
        worst = max(worst, time.monotonic() - t0)
    # An EXEC beside it runs normally too.
    res = a.run(7001, "echo fine")
    assert res["stdout"] == b"fine\n" and res["exit"] == 0, res
    produced = p.wait(pid, wait_ms=0)["out"]
    assert produced > BUFFER_MAX, produced  # it did flood
    assert p.signal(pid, 9)[0] == PONG
    assert p.wait(pid)["exit"] == 128 + 9
    # Generous: a starved channel would be seconds; this is about fairness, not speed.
    assert worst < 1.0, worst


def test_many_short_processes_are_reaped_and_listed(a: Agent) -> None:
    p = P(a)
    pids = []
    for i in range(150):
        pids.append(p.spawn(["sh", "-c", f"exit {i % 7}"])["pid"])
    for i, pid in enumerate(pids):
        assert p.wait(pid)["exit"] == i % 7
    listed = {x["pid"]: x for x in p.list()}
    for i, pid in enumerate(pids):
        assert listed[pid]["exit"] == i % 7 and not listed[pid]["flags"] & RUNNING
    assert len(listed) <= TRACKED_MAX
    # Past TRACKED_MAX records the oldest ended ones go.
    more = [p.spawn(["true"])["pid"] for _ in range(TRACKED_MAX - len(listed) + 10)]
    for pid in more:
        p.wait(pid)
    listed = p.list()
    assert len(listed) == TRACKED_MAX
    have = {x["pid"] for x in listed}
    assert all(pid in have for pid in more)
    # zombies: none of them is left unreaped
    for pid in pids + more:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                assert f.read().split(") ")[1][0] != "Z", pid
        except (ProcessLookupError, FileNotFoundError):
            pass


def test_evicted_record_answers_its_held_read(a: Agent) -> None:
    p = P(a)
    # Ended, but its child keeps stdout open: a read of it is held.
    pid = p.spawn(["sh", "-c", "sleep 30 & echo $!"])["pid"]
    line = p.read(pid, wait_ms=5000)[2]
    child = int(line)
    assert p.wait(pid)["exit"] == 0
    rid = p.rid()
    a.send(frame(PROC_READ, rid, struct.pack("<IBQII", pid, STDOUT, len(line), 10, 60000)))
    assert a.recv(0.3) is None
    # TRACKED_MAX newer records push it out (it ended first): the held read is answered.
    for _ in range(TRACKED_MAX):
        p.wait(p.spawn(["true"])["pid"])
    mtype, payload = p.reply(rid)
    assert mtype == ERROR and decode_error(payload)[0] == ERR_NO_PROCESS, payload
    assert pid not in {x["pid"] for x in p.list()}
    os.kill(child, 9)


def test_running_limit(a: Agent) -> None:
    p = P(a)
    pids = [p.spawn(["sleep", "60"])["pid"] for _ in range(PROC_MAX)]
    try:
        code, msg = p.spawn_error(["true"])
        assert code == ERR_LIMIT, msg
    finally:
        for pid in pids:
            p.signal(pid, 9)
        for pid in pids:
            p.wait(pid)
    assert p.spawn(["true"])["pid"] > 0


def test_held_reply_limit(a: Agent) -> None:
    p = P(a)
    pid = p.spawn(["sleep", "60"])["pid"]
    ids = []
    for _ in range(PENDING_MAX):
        rid = p.rid()
        ids.append(rid)
        a.send(frame(PROC_WAIT, rid, struct.pack("<II", pid, 60000)))
    mtype, payload = p.request(PROC_READ, struct.pack("<IBQII", pid, STDOUT, 0, 10, 60000))
    assert mtype == ERROR and decode_error(payload)[0] == ERR_LIMIT
    assert p.signal(pid, 15)[0] == PONG
    for rid in ids:
        mtype, payload = p.reply(rid)
        assert mtype == PROC_INFO and decode_info(payload)[0]["exit"] == 128 + 15


def test_processes_outlive_execs(a: Agent) -> None:
    p = P(a)
    pid = p.spawn(["sh", "-c", "while :; do sleep 0.1; done"])["pid"]
    res = a.run(7002, "sleep 0.1; echo done")
    assert res["exit"] == 0
    res = a.run(7003, "sleep 5", timeout_ms=200)
    assert res["flags"] & g.TIMED_OUT
    assert p.wait(pid, wait_ms=0)["flags"] & RUNNING
    p.signal(pid, 9)
    p.wait(pid)


def test_pty(a: Agent) -> None:
    p = P(a)
    info = p.spawn(
        [
            "sh",
            "-c",
            "python3 -c 'import os,sys; print(os.isatty(0), os.isatty(1), os.isatty(2))'; "
            "stty size; read line; stty size; echo got $line",
        ],
        pty=(100, 30),
        env={"TERM": "xterm"},
    )
    pid = info["pid"]
    assert info["flags"] & PTY
    out, off = p.read_until(pid, b"30 100")
    assert b"True True True" in out, out
    assert p.resize(pid, 132, 43)[0] == PONG
    assert p.write(pid, b"hi\n")[0] == PONG
    out, off = p.read_until(pid, b"got hi", off)
    assert b"43 132" in out, out
    assert p.wait(pid)["exit"] == 0
    assert p.read_all(pid, STDERR) == b""
    # Ctrl-C reaches the foreground job through the terminal.
    info = p.spawn(["sh", "-c", "echo ready; sleep 30; echo after"], pty=(80, 24))
    pid = info["pid"]
    out, off = p.read_until(pid, b"ready")
    time.sleep(0.2)
    t0 = time.monotonic()
    assert p.write(pid, b"\x03")[0] == PONG
    done = p.wait(pid)
    assert done["exit"] == 128 + 2 and time.monotonic() - t0 < 5, done
    # Resize on a process without a terminal, or ended.
    assert decode_error(p.resize(pid, 80, 24)[1])[0] == ERR_NO_PROCESS
    pid2 = p.spawn(["sleep", "5"])["pid"]
    assert decode_error(p.resize(pid2, 80, 24)[1])[0] == ERR_NO_PROCESS
    p.signal(pid2, 9)
    # Closing a terminal's stdin sends its EOF character; the process then ends on its own,
    # not by the hangup of a master closed while it was on its way out (SIGHUP, 129).
    for _ in range(10):
        pid3 = p.spawn(["cat"], pty=(80, 24))["pid"]
        assert p.write(pid3, b"", CLOSE_STDIN)[0] == PONG
        assert p.wait(pid3)["exit"] == 0


def test_boot_sweep_spares_processes() -> None:
    """As in the VM (PID 1 of fresh namespaces, user code as uid 1000): the sweep after each
    execution kills what the execution left, never a background process or its children."""
    a = Agent(boot=True)
    try:
        assert a.expect()[0] == g.READY
        p = P(a)
        lone = p.spawn(["sleep", "100"])["pid"]
        family = p.spawn(["sh", "-c", "sleep 101 & sleep 102 & wait"])["pid"]
        term = p.spawn(["sh", "-c", "id -u; stat -c %u $(tty); tty; exec sleep 103"], pty=(80, 24))
        out, _ = p.read_until(term["pid"], b"/dev/pts/")
        assert out.split(b"\r\n")[:2] == [b"1000", b"1000"], out
        res = a.run(7101, "setsid sleep 104 </dev/null >/dev/null 2>&1 & sleep 0.2; echo left")
        assert res["stdout"] == b"left\n", res
        res = a.run(7102, "sleep 5", timeout_ms=300)
        assert res["flags"] & g.TIMED_OUT
        res = a.run(7103, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done")
        running = res["stdout"].decode()
        for n in (100, 101, 102, 103):
            assert f"sleep {n}" in running, (n, running)
        assert "sleep 104" not in running and "sleep 5" not in running, running
        for pid in (lone, family, term["pid"]):
            assert p.wait(pid, wait_ms=0)["flags"] & RUNNING
        # Once a process ends, what it left in its session goes with the next sweep.
        assert p.signal(lone, 9)[0] == PONG
        assert p.wait(lone)["exit"] == 128 + 9
    finally:
        assert a.close() == 0


SHARED = [
    test_spawn_read_wait_list,
    test_read_holds_until_data_and_times_out_empty,
    test_write_and_close_stdin,
    test_spawn_failures,
    test_bad_frames_are_bad_requests,
    test_ring_drops_oldest_with_an_offset_jump,
    test_flood_does_not_stop_pings,
    test_processes_outlive_execs,
    test_pty,
    test_held_reply_limit,
    test_evicted_record_answers_its_held_read,
    test_running_limit,
    test_many_short_processes_are_reaped_and_listed,
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", default=g.AGENT)
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    g.AGENT = os.path.abspath(args.agent)
    failed = 0
    for fn in SHARED:
        if args.k not in fn.__name__:
            continue
        t0 = time.monotonic()
        a = Agent()
        try:
            assert a.expect()[0] == g.READY
            fn(a)
            print(f"ok    {fn.__name__} ({time.monotonic() - t0:.2f}s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {fn.__name__}", flush=True)
            traceback.print_exc()
        finally:
            if a.close() != 0:
                failed += 1
                print(f"FAIL  {fn.__name__}: agent exit status", flush=True)
    if args.k in "test_boot_sweep_spares_processes":
        if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("chroot"):
            t0 = time.monotonic()
            try:
                test_boot_sweep_spares_processes()
                print(f"ok    test_boot_sweep_spares_processes ({time.monotonic() - t0:.2f}s)")
            except Exception:
                failed += 1
                print("FAIL  test_boot_sweep_spares_processes", flush=True)
                traceback.print_exc()
        else:
            print("skip  test_boot_sweep_spares_processes (needs root, unshare and chroot)")
    print("FAILED" if failed else "all passed", f"({failed} failures)" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
