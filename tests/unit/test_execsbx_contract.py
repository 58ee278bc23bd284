"""Contract of the C extension exec_sandbox._execsbx, without a VM.

A small /bin/sh script stands in for QEMU (it ignores the QEMU arguments and speaks frames on
fd 3 with printf); that exercises spawn, the fd layout, the channel codec, poll_exit, kill and
close exactly as exec_sandbox.vm.binding uses them. Nothing here is evidence of sandbox behaviour
(isolation, the jail, the guest's answers): that is proven against real VMs in tests/integration.
"""

from __future__ import annotations

import errno
import gc
import os
import platform
import select
import socket
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exec_sandbox import _execsbx

KERNEL = "/nonexistent/vmlinux"
ROOTFS = "/nonexistent/rootfs.erofs"


def frame(kind: int, req_id: int, payload: bytes = b"", *, flags: int = 0) -> bytes:
    return struct.pack("<IBBHI", len(payload), kind, flags, 0, req_id) + payload


def sstr(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def ready(version: int = 1, agent: bytes = b"sbx-agent test") -> bytes:
    return frame(1, 0, struct.pack("<I", version) + sstr(agent))


def octal(data: bytes) -> str:
    return "".join(f"\\{b:03o}" for b in data)


def fake_qemu(tmp_path: Path, guest_bytes: bytes, then: str = "exec sleep 60") -> str:
    """A 'QEMU' that writes guest_bytes to the channel, 'console' to the console, then `then`."""
    script = tmp_path / "fake-qemu"
    script.write_text(f"#!/bin/sh\nprintf '{octal(guest_bytes)}' >&3\necho console\n{then}\n")
    script.chmod(0o755)
    return str(script)


def make_vm(qemu: str, **kw: object) -> _execsbx.Vm:
    """A Vm whose QEMU has exec'd (or the start's OSError, the child reaped)."""
    args: dict[str, object] = dict(qemu_binary=qemu, kernel=KERNEL, rootfs=ROOTFS, memory_mb=128)
    args.update(kw)
    vm = _execsbx.Vm(**args)
    try:
        vm.wait_spawn()
    except BaseException:
        vm.close()
        raise
    return vm


def collect(vm: _execsbx.Vm, until: Callable[[list[tuple]], bool], timeout: float = 10.0) -> list:
    events: list[tuple] = []
    deadline = time.monotonic() + timeout
    while not until(events):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; events so far: {events}"
        select.select([vm.fileno()], [], [], left)
        events += vm.read_events()
    return events


def wait_exit(vm: _execsbx.Vm, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while (status := vm.poll_exit()) is None:
        assert time.monotonic() < deadline
        select.select([vm.pidfd], [], [], 0.5)
    return status


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


# --- constants and the command line ---


def test_constants() -> None:
    x = _execsbx
    assert x.PROTOCOL_VERSION == 5
    assert x.CHANNEL_PORT_NAME == "org.execsandbox.agent.0"
    assert (x.LANG_PYTHON, x.LANG_JAVASCRIPT, x.LANG_RAW) == (1, 2, 3)
    assert (x.EXIT_TIMED_OUT, x.EXIT_STDOUT_LIMIT, x.EXIT_STDERR_LIMIT) == (1, 2, 4)
    assert (x.ERR_BAD_REQUEST, x.ERR_BUSY, x.ERR_SPAWN, x.ERR_INTERNAL) == (1, 2, 3, 4)
    assert (x.ERR_NO_PROCESS, x.ERR_LIMIT) == (5, 6)
    assert x.CODE_MAX == 1 << 20
    assert x.HOST_FRAME_MAX == 2 << 20
    assert x.GUEST_FRAME_MAX == 64 << 10
    assert x.DISKS_MAX == 6
    assert issubclass(x.ProtocolError, OSError)


def argv(**kw: object) -> list[str]:
    args: dict[str, object] = dict(
        qemu_binary="/usr/bin/qemu-system-x86_64",
        kernel="/k/vmlinux",
        rootfs="/r/rootfs.erofs",
        memory_mb=256,
        vcpus=2,
        accel="kvm",
    )
    args.update(kw)
    return _execsbx.build_qemu_argv(**args)


def value(args: list[str], opt: str) -> str:
    return args[args.index(opt) + 1]


def test_build_qemu_argv() -> None:
    a = argv(kernel_cmdline_extra="tsc=reliable")
    assert a[0] == "/usr/bin/qemu-system-x86_64"
    assert value(a, "-M") == "microvm,x-option-roms=off,isa-serial=off,acpi=off,memory-backend=ram0"
    assert (value(a, "-accel"), value(a, "-cpu")) == ("kvm", "host")
    assert (value(a, "-m"), value(a, "-smp")) == ("256", "2")
    assert value(a, "-kernel") == "/k/vmlinux"
    assert value(a, "-append") == (
        "console=hvc0 quiet root=/dev/vda rootfstype=erofs ro init=/usr/sbin/sbx-agent panic=-1"
        " random.trust_cpu=on tsc=reliable"
    )
    assert value(a, "-drive") == "file=/r/rootfs.erofs,if=none,id=root,format=raw,readonly=on"
    assert "socket,id=agent,fd=3" in a and "socket,id=con,fd=4" in a
    assert "virtserialport,chardev=agent,name=org.execsandbox.agent.0" in a
    for flag in ("-nodefaults", "-no-user-config", "-no-reboot"):
        assert flag in a
    assert "-sandbox" not in a
    t = argv(accel="tcg", rootfs=Path("rel/root.img"))
    assert (value(t, "-accel"), value(t, "-cpu")) == ("tcg,tb-size=128", "max,-erms")
    assert value(t, "-drive").startswith("file=./rel/root.img,")


@pytest.mark.parametrize(
    "bad",
    [
        {"rootfs": "/a,b/rootfs"},
        {"kernel": "/a,b"},
        {"accel": "hvf"},
        {"memory_mb": 0},
        {"memory_mb": -1},
        {"vcpus": 0},
        {"kernel_cmdline_extra": "a\nb"},
        {"kernel_cmdline_extra": "x" * 3000},
    ],
)
def test_build_qemu_argv_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        argv(**bad)


def test_build_qemu_argv_signature() -> None:
    with pytest.raises(TypeError):
        _execsbx.build_qemu_argv("/q", "/k", "/r", 1, 1, "tcg")  # type: ignore[misc]
    with pytest.raises(TypeError, match="accel"):
        _execsbx.build_qemu_argv(qemu_binary="q", kernel="/k", rootfs="/r", memory_mb=128, vcpus=1)
    with pytest.raises(ValueError):
        argv(rootfs="/a\0b")


def test_build_qemu_argv_disks_follow_the_root_in_order() -> None:
    a = argv(
        disks=[
            ("/c/python.erofs", "python", False),
            (b"/c/t.erofs", "template", False),
            (Path("rel/out.raw"), "output", True),
        ]
    )
    drives = [a[i + 1] for i, x in enumerate(a) if x == "-drive"]
    assert drives == [
        "file=/r/rootfs.erofs,if=none,id=root,format=raw,readonly=on",
        "file=/c/python.erofs,if=none,id=disk0,format=raw,readonly=on",
        "file=/c/t.erofs,if=none,id=disk1,format=raw,readonly=on",
        "file=./rel/out.raw,if=none,id=disk2,format=raw,readonly=off,"
        "werror=report,rerror=report,discard=unmap",
    ]
    devices = [a[i + 1] for i, x in enumerate(a) if x == "-device" and "blk" in a[i + 1]]
    assert devices == [
        "virtio-blk-device,drive=root",
        "virtio-blk-device,drive=disk0,serial=sbx-disk-python",
        "virtio-blk-device,drive=disk1,serial=sbx-disk-template",
        "virtio-blk-device,drive=disk2,serial=sbx-disk-output",
    ]
    assert argv(disks=()) == argv() == argv(disks=None)


@pytest.mark.parametrize(
    ("disks", "error", "match"),
    [
        ([("/d", k, False) for k in "abcdefg"], ValueError, "at most 6 disks"),
        ([("/d", "Python", False)], ValueError, "lower-case"),
        ([("/d", "abcdefghijk", False)], ValueError, "lower-case"),
        ([("/d", "py\0x", False)], ValueError, "lower-case"),
        ([("/d", "", False)], ValueError, "lower-case"),
        ([("/a", "python", False), ("/b", "python", True)], ValueError, "two disks"),
        ([("/a,b", "python", False)], ValueError, "','"),
        ([("/d", 1, False)], TypeError, "path, kind, writable"),
        ([("/d", "python")], TypeError, "path, kind, writable"),
        ([["/d", "python", False]], TypeError, "path, kind, writable"),
        (7, TypeError, "sequence"),
    ],
)
def test_build_qemu_argv_refuses_bad_disks(
    disks: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        argv(disks=disks)


def test_tsc_khz() -> None:
    khz = _execsbx.tsc_khz()
    assert isinstance(khz, int)
    if platform.machine() == "x86_64":
        assert 500_000 < khz < 10_000_000
    else:
        assert khz == 0


# --- Vm ---


def test_vm_missing_binary() -> None:
    with pytest.raises(FileNotFoundError) as info:
        make_vm("/nonexistent/qemu-system-x86_64")
    assert info.value.errno == errno.ENOENT
    assert "(from execve)" in str(info.value)
    assert info.value.filename == "/nonexistent/qemu-system-x86_64"


def test_vm_returns_after_the_fork_and_reports_the_exec_on_spawn_fd() -> None:
    # No OSError from the constructor for a missing binary: the child's exec fails later, and
    # an event loop learns it from spawn_fd (the error pipe) without blocking.
    vm = _execsbx.Vm(qemu_binary="/nonexistent/qemu", kernel=KERNEL, rootfs=ROOTFS, memory_mb=128)
    try:
        spawn_fd = vm.spawn_fd
        assert spawn_fd >= 0 and vm.pid > 0 and vm.pidfd >= 0
        assert select.select([spawn_fd], [], [], 10)[0] == [spawn_fd]
        for _ in range(2):  # kept: asked again, the same answer
            with pytest.raises(FileNotFoundError, match=r"\(from execve\)"):
                vm.check_spawn()
        assert vm.spawn_fd == -1 and not fd_is_open(spawn_fd)
        assert wait_exit(vm) == 127
    finally:
        vm.close()
    ok = _execsbx.Vm(qemu_binary="/bin/true", kernel=KERNEL, rootfs=ROOTFS, memory_mb=128)
    try:
        select.select([ok.spawn_fd], [], [], 10)
        assert ok.check_spawn() is True and ok.spawn_fd == -1
    finally:
        ok.close()


def test_vm_not_executable(tmp_path: Path) -> None:
    f = tmp_path / "qemu"
    f.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        make_vm(str(f))


def test_vm_invalid_config_is_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        make_vm("/bin/true", accel="whpx")
    with pytest.raises(TypeError):
        _execsbx.Vm("/bin/true")  # type: ignore[call-arg]


def test_vm_lifecycle(tmp_path: Path) -> None:
    out = tmp_path / "host-to-guest.bin"
    qemu = fake_qemu(tmp_path, ready(), then=f"exec cat <&3 >'{out}'")
    vm = make_vm(qemu, vcpus=1, accel="tcg")
    fds = (vm.channel_fd, vm.console_fd, vm.pidfd)
    assert vm.pid > 0 and all(fd >= 0 for fd in fds) and not vm.closed
    assert vm.fileno() == vm.channel_fd
    for fd in fds:
        assert os.get_blocking(fd) is False or fd == vm.pidfd
    assert stat.S_ISSOCK(os.fstat(vm.channel_fd).st_mode)

    events = collect(vm, lambda ev: any(e[0] == "ready" for e in ev))
    assert ("ready", 0, 1, "sbx-agent test") in events

    console = b""
    deadline = time.monotonic() + 10
    while b"console\n" not in console and time.monotonic() < deadline:
        select.select([vm.console_fd], [], [], 1)
        console += vm.read_console()
    assert console == b"console\n"
    assert vm.read_console() == b""  # nothing more: does not block

    assert vm.send_ping(7) == 0
    pending = vm.send_exec(9, _execsbx.LANG_RAW, 1000, 100, 200, [(b"A", b"1")], b"echo hi")
    while pending:
        select.select([], [vm.fileno()], [], 1)
        pending = vm.flush()
    expected = frame(65, 7) + frame(
        64,
        9,
        bytes([3])
        + struct.pack("<IIII", 1000, 100, 200, 1)
        + sstr(b"A")
        + sstr(b"1")
        + sstr(b"echo hi"),
    )
    deadline = time.monotonic() + 10
    while (not out.exists() or out.stat().st_size < len(expected)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert out.read_bytes() == expected

    assert vm.poll_exit() is None
    vm.kill()
    vm.kill()
    assert wait_exit(vm) == -9
    vm.kill()  # reaped: no-op
    vm.close()
    assert vm.closed
    assert (vm.pid, vm.channel_fd, vm.console_fd, vm.pidfd) == (-1, -1, -1, -1)
    assert not any(fd_is_open(fd) for fd in fds)
    assert vm.poll_exit() == -9
    vm.close()
    with pytest.raises(ValueError):
        vm.read_events()
    with pytest.raises(ValueError):
        vm.send_ping(1)
    with pytest.raises(ValueError):
        vm.read_console()
    with pytest.raises(ValueError):
        vm.fileno()


def test_vm_events_eof_and_exit_status(tmp_path: Path) -> None:
    guest = (
        ready()
        + frame(2, 5, b"out")
        + frame(3, 5, b"err")
        + frame(4, 5, struct.pack("<iIQ", 137, 2, 12345))
        + frame(5, 6, struct.pack("<I", 2) + sstr(b"busy \xff"))
        + frame(6, 7)
    )
    vm = make_vm(fake_qemu(tmp_path, guest, then="exit 3"))
    events = collect(vm, lambda ev: bool(ev) and ev[-1] == ("eof",))
    assert events == [
        ("ready", 0, 1, "sbx-agent test"),
        ("stdout", 5, b"out"),
        ("stderr", 5, b"err"),
        ("exit", 5, 137, 2, 12345),
        ("error", 6, 2, "busy \ufffd"),
        ("pong", 7),
        ("eof",),
    ]
    assert vm.read_events() == [("eof",)]
    # Typed values: each kind its own type, its fields by name, at the positions above.
    ready_ev, out, _, exit_ev, error, pong, eof = events
    assert type(ready_ev) is _execsbx.ReadyEvent and ready_ev.agent_version == "sbx-agent test"
    assert (ready_ev.kind, ready_ev.id, ready_ev.protocol_version) == ("ready", 0, 1)
    assert type(out) is _execsbx.OutputEvent
    assert (out.kind, out.id, out.data) == ("stdout", 5, b"out")
    assert type(exit_ev) is _execsbx.ExitEvent
    assert (exit_ev.exit_code, exit_ev.flags, exit_ev.duration_us) == (137, 2, 12345)
    assert type(error) is _execsbx.ErrorEvent and (error.code, error.message) == (2, "busy \ufffd")
    assert type(pong) is _execsbx.AckEvent and (pong.kind, pong.id) == ("pong", 7)
    assert type(eof) is _execsbx.EofEvent and eof.kind == "eof" and not hasattr(eof, "id")
    assert wait_exit(vm) == 3
    with pytest.raises(BrokenPipeError):
        vm.send_ping(1)
    vm.close()
    assert vm.poll_exit() == 3


@pytest.mark.parametrize(
    ("bad", "err"),
    [
        (frame(2, 1, b"x", flags=1), errno.EPROTO),  # nonzero reserved byte
        (struct.pack("<IBBHI", 64 * 1024 + 1, 2, 0, 0, 1), errno.EMSGSIZE),  # oversize
        (frame(64, 1), errno.EPROTO),  # host -> guest type
        (frame(99, 1), errno.EPROTO),  # unknown type
        (frame(4, 1, struct.pack("<iIQ", 256, 0, 0)), errno.EPROTO),  # exit code out of range
        (frame(4, 1, struct.pack("<iIQ", 0, 16, 0)), errno.EPROTO),  # unknown exit flag
        (frame(4, 1, b"\0" * 15), errno.EPROTO),  # short exit payload
        (frame(1, 0, struct.pack("<I", 1) + struct.pack("<I", 9) + b"short"), errno.EPROTO),
        (frame(2, 1, b""), errno.EPROTO),  # empty output chunk
    ],
)
def test_vm_protocol_error_is_sticky(tmp_path: Path, bad: bytes, err: int) -> None:
    vm = make_vm(fake_qemu(tmp_path, frame(6, 1) + bad + frame(6, 2)))
    try:
        events: list[tuple] = []
        with pytest.raises(_execsbx.ProtocolError) as info:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                select.select([vm.fileno()], [], [], 1)
                events += vm.read_events()
        # The good frame before the violation is delivered (returned by an earlier call, or
        # attached to the exception), the one after it never is.
        assert events + info.value.events == [("pong", 1)]
        assert info.value.errno == err
        assert isinstance(info.value, OSError)
        with pytest.raises(_execsbx.ProtocolError):
            vm.read_events()
    finally:
        vm.close()


def test_send_exec_validation(tmp_path: Path) -> None:
    vm = make_vm(fake_qemu(tmp_path, b""))
    ok: dict[str, object] = dict(
        id=1,
        language=1,
        timeout_ms=1000,
        stdout_limit=10,
        stderr_limit=10,
        env=[],
        code=b"print(1)",
    )
    try:
        for change, exc in [
            ({"language": 4}, ValueError),
            ({"timeout_ms": 86_400_001}, ValueError),
            ({"timeout_ms": 2**32 - 1}, ValueError),
            ({"id": -1}, ValueError),
            ({"id": 1 << 32}, ValueError),
            ({"code": b"x" * ((1 << 20) + 1)}, ValueError),
            ({"env": [(b"A=B", b"1")]}, ValueError),
            ({"env": [(b"", b"1")]}, ValueError),
            ({"env": [(b"A", b"\0")]}, ValueError),
            ({"env": [(b"V%d" % i, b"") for i in range(101)]}, ValueError),
            ({"env": [("A", "1")]}, TypeError),
            ({"env": [(b"A",)]}, TypeError),
            ({"env": None}, TypeError),
            ({"code": "print(1)"}, TypeError),
            ({"language": 1.0}, TypeError),
        ]:
            with pytest.raises(exc):
                vm.send_exec(**{**ok, **change})
        assert vm.send_exec(**ok) >= 0
        assert vm.send_exec(**{**ok, "code": bytearray(b"x")}) >= 0
    finally:
        vm.close()


def test_context_manager_and_dealloc(tmp_path: Path) -> None:
    qemu = fake_qemu(tmp_path, b"")
    with make_vm(qemu) as vm:
        pid = vm.pid
        fds = (vm.channel_fd, vm.console_fd, vm.pidfd)
    assert vm.closed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not any(fd_is_open(fd) for fd in fds)

    vm = make_vm(qemu)
    pid, fds = vm.pid, (vm.channel_fd, vm.console_fd, vm.pidfd)
    del vm
    gc.collect()
    with pytest.raises(ProcessLookupError):  # killed and reaped: no zombie either
        os.kill(pid, 0)
    assert not any(fd_is_open(fd) for fd in fds)


def test_qemu_gets_only_its_fds(tmp_path: Path) -> None:
    qemu = fake_qemu(tmp_path, b"", then="exec sleep 60")
    leaked = os.open("/dev/null", os.O_RDONLY)
    os.set_inheritable(leaked, True)
    try:
        vm = make_vm(qemu)
    finally:
        os.close(leaked)
    try:
        # Wait for sleep to be exec'd and settled (the shell and ld.so open files meanwhile).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            fds = sorted(int(fd) for fd in os.listdir(f"/proc/{vm.pid}/fd"))
            comm = Path(f"/proc/{vm.pid}/comm").read_text().strip()
            if comm == "sleep" and fds == [0, 1, 2, 3, 4]:
                break
            time.sleep(0.01)
        assert (comm, fds) == ("sleep", [0, 1, 2, 3, 4])
        with open(f"/proc/{vm.pid}/status") as f:
            assert "NoNewPrivs:\t1\n" in f.read()
        assert os.getpgid(vm.pid) == vm.pid
    finally:
        vm.close()


# --- speed tiers: QMP socket, file-backed RAM, RESEED ---


def test_build_qemu_argv_snapshot_options() -> None:
    plain = argv()
    assert "-mon" not in plain and "-incoming" not in plain
    assert value(plain, "-object") == "memory-backend-ram,id=ram0,size=256M"
    clone = argv(qmp=True, mem_path="/c/ram", mem_shared=False, incoming=True)
    assert value(clone, "-object") == (
        "memory-backend-file,id=ram0,size=256M,mem-path=/c/ram,share=off"
    )
    assert value(clone, "-M").endswith(",memory-backend=ram0")
    assert value(clone, "-mon") == "chardev=qmp,mode=control"
    assert "socket,id=qmp,fd=5" in clone
    assert value(clone, "-incoming") == "defer"
    assert value(argv(qmp=True, mem_path="/c/ram", mem_shared=True), "-object").endswith("share=on")
    with pytest.raises(ValueError, match="incoming needs qmp"):
        argv(incoming=True)
    with pytest.raises(ValueError, match="mem_path"):
        argv(mem_path="/a,b")
    # The RAM file as an fd the host opened (fd 6 in QEMU): what the jailed scheduler uses.
    assert value(argv(mem_fd=9, mem_shared=False), "-object") == (
        "memory-backend-file,id=ram0,size=256M,mem-path=/proc/self/fd/6,share=off"
    )
    with pytest.raises(ValueError, match="exclude each other"):
        argv(mem_fd=9, mem_path="/c/ram")
    with pytest.raises(ValueError, match="mem_fd"):
        argv(mem_fd=-2)


def test_vm_qmp_socket_is_fd_5_of_the_child(tmp_path: Path) -> None:
    qemu = fake_qemu(tmp_path, b"", then='read line <&5; echo "qmp:$line" >&5; exec sleep 60')
    vm = make_vm(qemu, qmp=True)
    try:
        assert vm.qmp_fd >= 0 and vm.qmp_fd not in (vm.channel_fd, vm.console_fd)
        os.write(vm.qmp_fd, b"hello\n")
        select.select([vm.qmp_fd], [], [], 10)
        assert os.read(vm.qmp_fd, 100) == b"qmp:hello\n"
        # Once sleep runs and its loader has closed what it opened, only fds 0-5 are left.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            comm = Path(f"/proc/{vm.pid}/comm").read_text().strip()
            fds = sorted(int(fd) for fd in os.listdir(f"/proc/{vm.pid}/fd"))
            if comm == "sleep" and fds == [0, 1, 2, 3, 4, 5]:
                break
            time.sleep(0.01)
        assert (comm, fds) == ("sleep", [0, 1, 2, 3, 4, 5])
    finally:
        qmp_fd = vm.qmp_fd
        vm.close()
    assert vm.qmp_fd == -1 and not fd_is_open(qmp_fd)
    assert make_vm(qemu).qmp_fd == -1


def test_vm_net_port_socket_is_fd_7_of_the_child(tmp_path: Path) -> None:
    # The network port: its own socketpair, QEMU's end at fd 7, the host's end in net_fd
    # (owned and closed by the Vm); a plain VM has neither, nor the port on QEMU's command line.
    qemu = fake_qemu(tmp_path, b"", then='read line <&7; echo "net:$line" >&7; exec sleep 60')
    vm = make_vm(qemu, net_port=True)
    try:
        assert vm.net_fd >= 0 and vm.net_fd not in (vm.channel_fd, vm.console_fd, vm.qmp_fd)
        os.write(vm.net_fd, b"hello\n")
        select.select([vm.net_fd], [], [], 10)
        assert os.read(vm.net_fd, 100) == b"net:hello\n"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            comm = Path(f"/proc/{vm.pid}/comm").read_text().strip()
            fds = sorted(int(fd) for fd in os.listdir(f"/proc/{vm.pid}/fd"))
            if comm == "sleep" and fds == [0, 1, 2, 3, 4, 7]:
                break
            time.sleep(0.01)
        assert (comm, fds) == ("sleep", [0, 1, 2, 3, 4, 7])
    finally:
        net_fd = vm.net_fd
        vm.close()
    assert vm.net_fd == -1 and not fd_is_open(net_fd)
    plain = make_vm(qemu)
    try:
        assert plain.net_fd == -1
    finally:
        plain.close()
    assert "virtserialport,chardev=net,name=org.execsandbox.net.0" in argv(net_port=True)
    assert "virtio-serial-device,max_ports=3" in argv(net_port=True)
    assert "virtio-serial-device,max_ports=2" in argv()
    assert not any("chardev=net" in a for a in argv())


def test_vm_mem_fd_is_fd_6_of_the_child(tmp_path: Path) -> None:
    ram = tmp_path / "ram"
    ram.write_bytes(b"")
    qemu = fake_qemu(tmp_path, b"")
    fd = os.open(ram, os.O_RDWR | os.O_CLOEXEC)
    try:
        vm = make_vm(qemu, qmp=True, mem_fd=fd)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                comm = Path(f"/proc/{vm.pid}/comm").read_text().strip()
                fds = sorted(int(n) for n in os.listdir(f"/proc/{vm.pid}/fd"))
                if comm == "sleep" and fds == [0, 1, 2, 3, 4, 5, 6]:
                    break
                time.sleep(0.01)
            assert (comm, fds) == ("sleep", [0, 1, 2, 3, 4, 5, 6])
            assert os.readlink(f"/proc/{vm.pid}/fd/6") == str(ram)
        finally:
            vm.close()
        os.fstat(fd)  # the caller keeps its fd
    finally:
        os.close(fd)


def test_send_reseed_and_reseeded_event(tmp_path: Path) -> None:
    # The stand-in echoes the 84-byte RESEED frame it receives back to stdout (the console) and
    # answers RESEEDED (type 32) with the same id.
    qemu = fake_qemu(
        tmp_path,
        b"",
        then=(
            "head -c 84 <&3 | od -An -tx1 | tr -d ' \\n'; echo; "
            f"printf '{octal(frame(32, 9))}' >&3; exec sleep 60"
        ),
    )
    vm = make_vm(qemu)
    try:
        assert _execsbx.RESEED_BYTES == 64
        with pytest.raises(ValueError, match="seed must be 64 bytes"):
            vm.send_reseed(9, b"x" * 63)
        seed = bytes(range(64))
        assert vm.send_reseed(9, seed, 0x1122334455667788) == 0
        events = collect(vm, lambda ev: bool(ev))
        assert events == [("reseeded", 9)]
        deadline = time.monotonic() + 10
        console = b""
        while console.count(b"\n") < 2:
            assert time.monotonic() < deadline
            select.select([vm.console_fd], [], [], 1)
            console += vm.read_console()
        sent = bytes.fromhex(console.decode().splitlines()[1])
        assert sent == frame(96, 9, seed + struct.pack("<Q", 0x1122334455667788))
    finally:
        vm.close()


def test_file_events_decode_to_typed_values(tmp_path: Path) -> None:
    entries = (
        struct.pack("<I", 2)
        + b"\x01"
        + struct.pack("<Q", 4096)
        + sstr(b"dir")
        + b"\x00"
        + struct.pack("<Q", 5)
        + sstr(b"a\xff.txt")
    )
    guest = (
        ready()
        + frame(7, 9, b"file bytes")
        + frame(9, 9, struct.pack("<Q", 10))
        + frame(8, 10, entries)
        + frame(10, 11, struct.pack("<I", 2) + sstr(b"gone"))
    )
    vm = make_vm(fake_qemu(tmp_path, guest, then="exit 0"))
    try:
        events = collect(vm, lambda ev: bool(ev) and ev[-1] == ("eof",))
        assert events[1:] == [
            ("file_data", 9, b"file bytes"),
            ("file_done", 9, 10),
            ("file_entries", 10, [(b"dir", True, 4096), (b"a\xff.txt", False, 5)]),
            ("file_error", 11, 2, "gone"),
            ("eof",),
        ]
        data, done, listing, error = events[1:5]
        assert (data.kind, data.data) == ("file_data", b"file bytes")
        assert type(done) is _execsbx.FileDoneEvent and done.total == 10
        assert type(listing) is _execsbx.FileEntriesEvent
        first = listing.entries[0]
        assert type(first) is _execsbx.FileEntry
        assert (first.name, first.is_dir, first.size) == (b"dir", True, 4096)
        assert (error.kind, error.code, error.message) == ("file_error", 2, "gone")
    finally:
        vm.close()


def tool_call(req_id: int, call: int, name: bytes, arguments: bytes) -> bytes:
    return frame(11, req_id, struct.pack("<I", call) + sstr(name) + sstr(arguments))


def output(req_id: int, flags: int, mime: bytes | None, data: bytes) -> bytes:
    return frame(12, req_id, bytes([flags]) + (sstr(mime) if mime is not None else b"") + data)


def test_tool_call_and_output_events_decode_to_typed_values(tmp_path: Path) -> None:
    x = _execsbx
    assert (x.OUTPUT_BEGIN, x.OUTPUT_END) == (1, 2)
    assert (x.TOOL_NAME_MAX, x.TOOL_ARGS_MAX, x.MIME_TYPE_MAX) == (64, 60 << 10, 127)
    assert (x.OUTPUT_DATA_MAX, x.OUTPUT_ITEM_MAX) == (60 << 10, 4 << 20)
    assert x.OUTPUT_BYTES_MAX == 16 << 20
    assert (x.TOOL_CALLS_MAX, x.OUTPUTS_MAX) == (16, 32)
    args = b'{"args": ["Paris"], "kwargs": {}}'
    guest = (
        ready()
        + tool_call(5, 1, b"get_weather", args)
        + output(5, x.OUTPUT_BEGIN, b"text/html", b"<b>")
        + output(5, 0, None, b"bold")
        + output(5, x.OUTPUT_END, None, b"</b>")
        + output(5, x.OUTPUT_BEGIN | x.OUTPUT_END, b"image/svg+xml", b"")
    )
    vm = make_vm(fake_qemu(tmp_path, guest, then="exit 0"))
    try:
        events = collect(vm, lambda ev: bool(ev) and ev[-1] == ("eof",))
        assert events[1:] == [
            ("tool_call", 5, 1, "get_weather", args),
            ("output", 5, 1, "text/html", b"<b>"),
            ("output", 5, 0, "", b"bold"),
            ("output", 5, 2, "", b"</b>"),
            ("output", 5, 3, "image/svg+xml", b""),
            ("eof",),
        ]
        call, begin, middle = events[1:4]
        assert type(call) is _execsbx.ToolCallEvent
        assert (call.kind, call.id, call.call) == ("tool_call", 5, 1)
        assert (call.name, call.arguments) == ("get_weather", args)
        assert (
            type(begin) is _execsbx.OutputChunkEvent and type(middle) is _execsbx.OutputChunkEvent
        )
        assert (begin.kind, begin.id, begin.flags) == ("output", 5, x.OUTPUT_BEGIN)
        assert (begin.mime_type, begin.data) == ("text/html", b"<b>")
        assert (middle.flags, middle.mime_type, middle.data) == (0, "", b"bold")
        # Not an OutputEvent: code that routes stdout by that type never sees a rich output.
        assert not isinstance(begin, _execsbx.OutputEvent)
    finally:
        vm.close()


@pytest.mark.parametrize(
    ("bad", "err"),
    [
        (tool_call(1, 0, b"f", b"{}"), errno.EPROTO),  # call 0
        (tool_call(1, 1, b"", b"{}"), errno.EPROTO),  # empty name
        (tool_call(1, 1, b"a-b", b"{}"), errno.EPROTO),  # not an identifier
        (tool_call(1, 1, b"1f", b"{}"), errno.EPROTO),
        (tool_call(1, 1, b"f", b""), errno.EPROTO),  # empty arguments
        (tool_call(1, 1, b"f" * 65, b"{}"), errno.EMSGSIZE),  # name over TOOL_NAME_MAX
        (tool_call(1, 1, b"f", b" " * (60 * 1024 + 1)), errno.EMSGSIZE),  # arguments over
        (frame(11, 1, struct.pack("<I", 1) + sstr(b"f") + sstr(b"{}") + b"x"), errno.EPROTO),
        (output(1, 4, None, b"x"), errno.EPROTO),  # unknown flag
        (output(1, 1, b"textplain", b"x"), errno.EPROTO),  # no '/'
        (output(1, 1, b"text/plain/x", b"x"), errno.EPROTO),  # two
        (output(1, 1, b"Text/Plain", b"x"), errno.EPROTO),  # uppercase
        (output(1, 1, b"text/", b"x"), errno.EPROTO),  # empty subtype
        (output(1, 1, b"t" * 64 + b"/" + b"s" * 63, b""), errno.EMSGSIZE),  # type over 127
        (output(1, 2, None, b"x" * (60 * 1024 + 1)), errno.EPROTO),  # data over 60 KiB
        (frame(12, 1), errno.EPROTO),  # no flags
    ],
)
def test_malformed_tool_calls_and_outputs_are_protocol_errors(
    tmp_path: Path, bad: bytes, err: int
) -> None:
    vm = make_vm(fake_qemu(tmp_path, frame(6, 1) + bad))
    try:
        with pytest.raises(_execsbx.ProtocolError) as info:
            collect(vm, lambda ev: False)
        assert info.value.errno == err
    finally:
        vm.close()


def test_tool_result_goes_on_the_wire_in_the_protocol_layout(tmp_path: Path) -> None:
    """TOOL_RESULT as protocol.h lays it out: u32 call, u8 status, str body, with the id of the
    execution that made the call."""
    x = _execsbx
    assert (x.MSG_TOOL_RESULT, x.TOOL_OK, x.TOOL_ERROR, x.TOOL_RESULT_MAX) == (72, 0, 1, 1 << 20)
    wire = tmp_path / "wire"
    vm = make_vm(fake_qemu(tmp_path, b"", then=f"exec cat <&3 > {wire}"))
    big = b"r" * x.TOOL_RESULT_MAX
    want = (
        frame(72, 5, struct.pack("<IB", 1, 0) + sstr(b'{"temp": 21}'))
        + frame(72, 5, struct.pack("<IB", 0xFFFFFFFF, 1) + sstr(b"no such city"))
        + frame(72, 6, struct.pack("<IB", 2, 1) + sstr(b""))
        + frame(72, 7, struct.pack("<IB", 3, 0) + sstr(big))
    )
    try:
        assert vm.send_tool_result(5, 1, x.TOOL_OK, b'{"temp": 21}') >= 0
        vm.send_tool_result(5, 0xFFFFFFFF, x.TOOL_ERROR, bytearray(b"no such city"))
        vm.send_tool_result(6, 2, x.TOOL_ERROR, b"")
        vm.send_tool_result(7, 3, x.TOOL_OK, memoryview(big))
        assert _flushed_to(vm, wire, len(want)) == want
    finally:
        vm.close()


def test_tool_results_the_guest_would_refuse_are_refused(tmp_path: Path) -> None:
    vm = make_vm(fake_qemu(tmp_path, b""))
    try:
        for args, exc, match in [
            ((1, 1, 2, b""), ValueError, "tool status 2 is neither 0"),  # REFUSED: the agent's
            ((1, 1, 256, b""), ValueError, "tool status 256 is neither 0"),
            ((1, 1, -1, b""), ValueError, "status must be in 0"),
            ((1, 0, 0, b"{}"), ValueError, "call 0 is no tool call"),
            ((1, 1 << 32, 0, b"{}"), ValueError, "call must be in 0"),
            ((-1, 1, 0, b"{}"), ValueError, "id must be in 0"),
            ((1, 1, 0, b"x" * ((1 << 20) + 1)), ValueError, "tool result over 1 MiB"),
            ((1, 1, 0, "{}"), TypeError, "bytes-like"),
            ((1, 1, 0.0, b"{}"), TypeError, "status must be an int"),
            ((1, 1, 0), TypeError, "takes exactly 4 arguments"),
        ]:
            with pytest.raises(exc, match=match):
                vm.send_tool_result(*args)
        assert vm.flush() == 0  # nothing was queued
    finally:
        vm.close()
    with pytest.raises(ValueError):
        vm.send_tool_result(1, 1, 0, b"{}")  # closed


def test_reseeded_with_a_payload_is_a_protocol_error(tmp_path: Path) -> None:
    vm = make_vm(fake_qemu(tmp_path, frame(32, 1, b"x")))
    try:
        with pytest.raises(_execsbx.ProtocolError, match="malformed reseeded"):
            collect(vm, lambda ev: False)
    finally:
        vm.close()


@pytest.mark.parametrize(
    "bad",
    [
        frame(7, 1, b""),  # empty file chunk
        frame(7, 1, b"x" * (60 * 1024 + 1)),  # file chunk over FILE_CHUNK_MAX
        frame(8, 1, struct.pack("<I", 1) + b"\x00" + struct.pack("<Q", 1) + sstr(b"..")),
        frame(8, 1, struct.pack("<I", 1) + b"\x00" + struct.pack("<Q", 1) + sstr(b"a/b")),
        frame(8, 1, struct.pack("<I", 2) + b"\x00" + struct.pack("<Q", 1) + sstr(b"a")),
        frame(9, 1, b"\0" * 7),  # short FILE_DONE
        frame(10, 1, struct.pack("<I", 9) + sstr(b"x")),  # unknown file error kind
        frame(66, 1),  # host -> guest session type
    ],
)
def test_malformed_file_events_are_protocol_errors(tmp_path: Path, bad: bytes) -> None:
    vm = make_vm(fake_qemu(tmp_path, frame(6, 1) + bad))
    try:
        with pytest.raises(_execsbx.ProtocolError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                select.select([vm.fileno()], [], [], 1)
                vm.read_events()
    finally:
        vm.close()


def test_file_requests_go_on_the_wire_in_the_protocol_layout(tmp_path: Path) -> None:
    """Stand-in QEMU (no VM) recording what the host writes to the channel: each send_file_*()
    puts exactly one frame on the wire, encoded by the extension as protocol.h lays it out."""
    wire = tmp_path / "wire"
    vm = make_vm(fake_qemu(tmp_path, b"", then=f"exec cat <&3 > {wire}"))
    want = (
        frame(_execsbx.MSG_FILE_WRITE_BEGIN, 3, sstr(b"d/x") + bytes([_execsbx.FILE_EXECUTABLE]))
        + frame(_execsbx.MSG_FILE_WRITE_DATA, 3, b"xyz")
        + frame(_execsbx.MSG_FILE_WRITE_END, 3, b"\x01")
        + frame(_execsbx.MSG_FILE_WRITE_BEGIN, 4, sstr(b"y") + b"\x00")
        + frame(_execsbx.MSG_FILE_WRITE_END, 4, b"\x00")
        + frame(_execsbx.MSG_FILE_READ, 5, sstr(b"a.txt") + b"\x00")
        + frame(_execsbx.MSG_FILE_LIST, 6, sstr(b""))
        + frame(_execsbx.MSG_FILE_WRITE_BEGIN, 7, sstr(b"") + bytes([_execsbx.FILE_NODE_SNAPSHOT]))
        + frame(_execsbx.MSG_FILE_READ, 8, sstr(b"") + bytes([_execsbx.FILE_NODE_SNAPSHOT]))
    )
    try:
        vm.send_file_write_begin(3, b"d/x", _execsbx.FILE_EXECUTABLE)
        vm.send_file_write_data(3, memoryview(b"xyz"))
        vm.send_file_write_end(3, True)
        vm.send_file_write_begin(4, b"y", 0)
        vm.send_file_write_end(4, False)
        vm.send_file_read(5, b"a.txt")
        assert vm.send_file_list(6, b"") >= 0
        vm.send_file_write_begin(7, b"", _execsbx.FILE_NODE_SNAPSHOT)
        vm.send_file_read(8, b"", _execsbx.FILE_NODE_SNAPSHOT)
        assert _flushed_to(vm, wire, len(want)) == want
    finally:
        vm.close()


def test_file_requests_over_the_protocol_limits_are_refused(tmp_path: Path) -> None:
    vm = make_vm(fake_qemu(tmp_path, b""))
    try:
        with pytest.raises(ValueError, match="payload larger than HOST_FRAME_MAX"):
            vm.send_file_write_data(3, b"x" * (_execsbx.HOST_FRAME_MAX + 1))
        with pytest.raises(ValueError, match="path longer than PATH_MAX"):
            vm.send_file_read(3, b"a" * (_execsbx.PATH_MAX + 1))
        with pytest.raises(ValueError, match="empty path"):
            vm.send_file_write_begin(3, b"", 0)
        with pytest.raises(ValueError, match="path contains NUL"):
            vm.send_file_read(3, b"a\x00b")
        # Node's startup snapshot is named by its flag alone; no flag outside the request's own.
        node = _execsbx.FILE_NODE_SNAPSHOT
        for send, path, flags in [
            (vm.send_file_write_begin, b"x", node),
            (vm.send_file_write_begin, b"", node | _execsbx.FILE_EXECUTABLE),
            (vm.send_file_read, b"x", node),
        ]:
            with pytest.raises(ValueError, match="takes no path"):
                send(3, path, flags)
        for send, flags in [
            (vm.send_file_read, _execsbx.FILE_EXECUTABLE),
            (vm.send_file_write_begin, 4),
            (vm.send_file_read, 0x100),
        ]:
            with pytest.raises(ValueError, match="unknown file flag"):
                send(3, b"x", flags)
        assert vm.flush() == 0  # nothing was queued
        assert vm.send_exec(1, 1, 1000, 10, 10, [], b"pass", session=True) >= 0
    finally:
        vm.close()


def test_net_config_goes_on_the_wire_in_the_protocol_layout(tmp_path: Path) -> None:
    """Stand-in QEMU (no VM) recording what the host writes to the channel: send_net_config()
    puts one NET_CONFIG frame on the wire, laid out as net_protocol.h says: u32 flags (1:
    outbound, 2: reattach), u32 name count and the names, u32 port count and the ports, str CA
    bundle."""
    wire = tmp_path / "wire"
    vm = make_vm(fake_qemu(tmp_path, b"", then=f"exec cat <&3 > {wire}"))
    want = (
        frame(
            _execsbx.MSG_NET_CONFIG,
            9,
            struct.pack("<II", 1, 2)
            + sstr(b"a.example")
            + sstr(b"b.example")
            + struct.pack("<II", 1, 8443)
            + sstr(b"PEM"),
        )
        + frame(
            _execsbx.MSG_NET_CONFIG,
            10,
            struct.pack("<II", 1, 1) + sstr(b"*") + struct.pack("<I", 0) + sstr(b""),
        )
        + frame(_execsbx.MSG_NET_CONFIG, 11, struct.pack("<III", 0, 0, 0) + sstr(b""))
        # reattach (a restored VM): flag 2, with outbound 3
        + frame(_execsbx.MSG_NET_CONFIG, 12, struct.pack("<III", 3, 0, 0) + sstr(b""))
    )
    try:
        vm.send_net_config(9, True, ["a.example", "b.example"], [8443], b"PEM")
        vm.send_net_config(10, True, ["*"], [], b"")
        assert vm.send_net_config(11, False, [], [], b"") >= 0
        vm.send_net_config(12, True, [], [], b"", reattach=True)
        assert _flushed_to(vm, wire, len(want)) == want
    finally:
        vm.close()


def test_net_config_over_the_protocol_limits_is_refused(tmp_path: Path) -> None:
    """What the guest would refuse is refused before it is queued, saying why."""
    vm = make_vm(fake_qemu(tmp_path, b""))
    too_many_ports = list(range(1000, 1001 + _execsbx.NET_EXTRA_PORTS_MAX))
    try:
        for outbound, names, ports, ca, match in [
            (
                True,
                ["a.example"] * (_execsbx.NET_NAMES_MAX + 1),
                [],
                b"",
                f"more than {_execsbx.NET_NAMES_MAX} names",
            ),
            (
                True,
                ["a" * (_execsbx.NET_NAME_MAX + 1)],
                [],
                b"",
                f"name 0 longer than {_execsbx.NET_NAME_MAX} bytes",
            ),
            (True, ["ok.example", "Example.org"], [], b"", "name 1 is not a lowercase DNS name"),
            (True, ["\u00e9.example"], [], b"", "name 0 is not a lowercase DNS name"),
            (True, ["-a.example"], [], b"", "name 0 is not a lowercase DNS name"),
            (
                True,
                [],
                too_many_ports,
                b"",
                f"more than {_execsbx.NET_EXTRA_PORTS_MAX} extra ports",
            ),
            (True, [], [0], b"", "port 0 outside 1..65535"),
            (True, [], [65536], b"", "port 65536 outside 1..65535"),
            (
                False,
                [],
                [],
                b"x" * (_execsbx.NET_CA_BUNDLE_MAX + 1),
                f"CA bundle larger than {_execsbx.NET_CA_BUNDLE_MAX} bytes",
            ),
            (False, [], [], b"PEM\0PEM", "CA bundle contains NUL"),
        ]:
            with pytest.raises(ValueError, match=match):
                vm.send_net_config(3, outbound, names, ports, ca)
        with pytest.raises(TypeError, match="names must be a sequence of str"):
            vm.send_net_config(3, True, [b"a.example"], [], b"")  # type: ignore[list-item]
        assert vm.flush() == 0  # nothing was queued
        # At every limit: accepted.
        names = [f"n{i}.example" for i in range(_execsbx.NET_NAMES_MAX)]
        assert (
            vm.send_net_config(
                4, True, names, too_many_ports[1:], b"x" * _execsbx.NET_CA_BUNDLE_MAX
            )
            >= 0
        )
    finally:
        vm.close()


@pytest.mark.parametrize(
    "version", [0, _execsbx.PROTOCOL_VERSION - 1, _execsbx.PROTOCOL_VERSION + 1, 0xFFFFFFFF]
)
async def test_a_guest_of_another_protocol_version_is_refused(tmp_path: Path, version: int) -> None:
    """Stand-in QEMU (no VM): an agent announcing another protocol version in READY makes the
    boot fail with VmPermanentError saying to rebuild the images, and the 'QEMU' is gone."""
    from exec_sandbox.errors import VmPermanentError
    from exec_sandbox.images.catalog import GuestImages
    from exec_sandbox.vm.guest import GuestVm
    from exec_sandbox.vm.spec import VmSpec

    images = GuestImages(kernel=Path(KERNEL), rootfs=Path(ROOTFS), kernel_hash="k", rootfs_hash="r")
    spec = VmSpec(
        qemu_binary=fake_qemu(tmp_path, ready(version)), images=images, accel="tcg", memory_mb=128
    )
    with pytest.raises(VmPermanentError, match=f"protocol version {version}.*sbx setup"):
        await GuestVm.boot(spec, registry=None, boot_timeout=10)
    # The same stand-in announcing this library's version boots.
    spec_ok = VmSpec(
        qemu_binary=fake_qemu(tmp_path, ready(_execsbx.PROTOCOL_VERSION)),
        images=images,
        accel="tcg",
        memory_mb=128,
    )
    guest = await GuestVm.boot(spec_ok, registry=None, boot_timeout=10)
    await guest.aclose()


def net_open(stream: int, name: bytes, port: int) -> bytes:
    return frame(48, stream, struct.pack("<I", port) + sstr(name))


def test_net_ring_events_are_typed_with_named_fields() -> None:
    """NetRing.run() gives struct sequences (like read_events()): named fields, kind first."""
    host, guest = socket.socketpair()
    with host, guest, _execsbx.NetRing(entries=16) as ring:
        relay = ring.add_relay(host.fileno())
        ring.ingest(relay, net_open(7, b"web.test", 443))
        events = ring.run()
        assert [type(e) for e in events] == [_execsbx.NetOpenEvent]
        (opened,) = events
        assert (opened.kind, opened.relay, opened.stream, opened.name, opened.port) == (
            "open",
            relay,
            7,
            "web.test",
            443,
        )
        ring.ingest(relay, frame(123, 7, struct.pack("<I", 0)))  # the guest's CLOSE(done)
        (closed,) = ring.run()
        assert isinstance(closed, _execsbx.NetClosedEvent)
        assert (
            closed.kind,
            closed.stream,
            closed.bytes_to_guest,
            closed.bytes_from_guest,
            closed.reset,
        ) == ("closed", 7, 0, 0, False)
        ring.ingest(relay, frame(120, 999, b"x"))  # DATA for no stream: a violation
        ended = [e for e in ring.run() if isinstance(e, _execsbx.NetRelayEndEvent)]
        assert [(e.kind, e.relay) for e in ended] == [("violation", relay)]
        assert "999" in ended[0].reason


def _flushed_to(vm: _execsbx.Vm, wire: Path, size: int) -> bytes:
    """What the stand-in QEMU recorded once vm flushed its queue and size bytes arrived (10 s)."""
    deadline = time.monotonic() + 10
    while vm.flush() and time.monotonic() < deadline:
        select.select([], [vm.fileno()], [], 1)
    while time.monotonic() < deadline and (not wire.exists() or wire.stat().st_size < size):
        time.sleep(0.01)
    return wire.read_bytes()


# --- background processes (protocol v5, "Processes") ---


def proc_entry(pid: int, flags: int, code: int, out: int, err: int, command: bytes) -> bytes:
    return struct.pack("<IBiQQ", pid, flags, code, out, err) + sstr(command)


def test_process_events_decode_to_typed_values(tmp_path: Path) -> None:
    x = _execsbx
    assert (x.MSG_PROC_SPAWN, x.MSG_PROC_RESIZE) == (73, 79)
    assert (x.PROC_RUNNING, x.PROC_PTY, x.PROC_STDIN_OPEN, x.PROC_DATA_EOF) == (1, 2, 4, 1)
    guest = (
        ready()
        + frame(
            13,
            8,
            struct.pack("<I", 2)
            + proc_entry(41, x.PROC_RUNNING | x.PROC_STDIN_OPEN, 0, 5, 0, b"sleep 9")
            + proc_entry(42, x.PROC_PTY, 130, 1 << 40, 0, b"bash --login -i"),
        )
        + frame(14, 9, struct.pack("<QB", 1 << 33, 0) + b"late bytes")
        + frame(14, 10, struct.pack("<QB", 7, x.PROC_DATA_EOF))
        + frame(5, 11, struct.pack("<I", x.ERR_NO_PROCESS) + sstr(b"no such process"))
    )
    vm = make_vm(fake_qemu(tmp_path, guest, then="exit 0"))
    try:
        events = collect(vm, lambda ev: bool(ev) and ev[-1] == ("eof",))
        info, data, eof, error = events[1:5]
        assert type(info) is _execsbx.ProcInfoEvent and (info.kind, info.id) == ("proc_info", 8)
        first, second = info.processes
        assert type(first) is _execsbx.ProcessEntry
        assert tuple(first) == (41, 5, 0, 5, 0, "sleep 9")
        assert (second.pid, second.exit_code, second.stdout_bytes) == (42, 130, 1 << 40)
        assert second.command == "bash --login -i"
        assert type(data) is _execsbx.ProcDataEvent
        assert (data.kind, data.id, data.offset, data.flags, data.data) == (
            "proc_data", 9, 1 << 33, 0, b"late bytes",
        )  # fmt: skip
        assert (eof.offset, eof.flags, eof.data) == (7, x.PROC_DATA_EOF, b"")
        assert (error.kind, error.code, error.message) == ("error", 5, "no such process")
    finally:
        vm.close()


@pytest.mark.parametrize(
    "bad",
    [
        frame(13, 1, struct.pack("<I", 1) + proc_entry(0, 0, 0, 0, 0, b"x")),  # pid 0
        frame(13, 1, struct.pack("<I", 1) + proc_entry(1, 8, 0, 0, 0, b"x")),  # unknown flag
        frame(13, 1, struct.pack("<I", 1) + proc_entry(1, 1, 3, 0, 0, b"x")),  # code, running
        frame(13, 1, struct.pack("<I", 1) + proc_entry(1, 0, 256, 0, 0, b"x")),
        frame(13, 1, struct.pack("<I", 1) + proc_entry(1, 0, 0, 0, 0, b"a\0b")),
        frame(13, 1, struct.pack("<I", 2) + proc_entry(1, 0, 0, 0, 0, b"x")),  # one missing
        frame(13, 1, struct.pack("<I", 257)),  # over PROC_TRACKED_MAX
        frame(14, 1, struct.pack("<QB", 0, 2)),  # unknown data flag
        frame(14, 1, struct.pack("<QB", 0, 0) + b"d" * (32 * 1024 + 1)),  # over a chunk
        frame(14, 1, struct.pack("<QB", (1 << 64) - 1, 0) + b"ab"),  # offset wraps
        frame(5, 1, struct.pack("<I", 7) + sstr(b"")),  # error code past ERR_LIMIT
    ],
)
def test_malformed_process_events_are_protocol_errors(tmp_path: Path, bad: bytes) -> None:
    vm = make_vm(fake_qemu(tmp_path, frame(6, 1) + bad))
    try:
        with pytest.raises(_execsbx.ProtocolError) as info:
            collect(vm, lambda ev: False)
        assert info.value.errno == errno.EPROTO
    finally:
        vm.close()


def test_process_requests_go_on_the_wire_in_the_protocol_layout(tmp_path: Path) -> None:
    x = _execsbx
    wire = tmp_path / "wire"
    vm = make_vm(fake_qemu(tmp_path, b"", then=f"exec cat <&3 > {wire}"))
    want = (
        frame(
            73,
            1,
            struct.pack("<BHHI", 1, 80, 24, 2)
            + sstr(b"sh")
            + sstr(b"-l")
            + sstr(b"/tmp")
            + struct.pack("<I", 1)
            + sstr(b"TERM")
            + sstr(b"xterm-256color"),
        )
        + frame(73, 2, struct.pack("<BHHI", 0, 0, 0, 1) + sstr(b"true") + sstr(b"") + b"\0" * 4)
        + frame(74, 3, struct.pack("<IBQII", 41, 2, 1 << 40, 32768, 30000))
        + frame(75, 4, struct.pack("<IB", 41, 1) + b"bye")
        + frame(76, 5, struct.pack("<II", 41, 15))
        + frame(77, 6, struct.pack("<II", 41, 0))
        + frame(78, 7)
        + frame(79, 8, struct.pack("<IHH", 41, 132, 43))
    )
    try:
        vm.send_proc_spawn(1, [b"sh", b"-l"], b"/tmp", [(b"TERM", b"xterm-256color")], True, 80, 24)
        vm.send_proc_spawn(2, (b"true",), b"", [])
        vm.send_proc_read(3, 41, x.PROC_STDERR, 1 << 40, x.OUTPUT_CHUNK_MAX, 30000)
        vm.send_proc_write(4, 41, memoryview(b"bye"), close_stdin=True)
        vm.send_proc_signal(5, 41, 15)
        vm.send_proc_wait(6, 41, 0)
        vm.send_proc_list(7)
        vm.send_proc_resize(8, 41, 132, 43)
        assert _flushed_to(vm, wire, len(want)) == want
    finally:
        vm.close()


def test_process_requests_the_guest_would_refuse_are_refused(tmp_path: Path) -> None:
    vm = make_vm(fake_qemu(tmp_path, b""))
    try:
        for call, exc in [
            (lambda: vm.send_proc_spawn(1, [], b"", []), ValueError),  # no argv
            (lambda: vm.send_proc_spawn(1, [b""], b"", []), ValueError),
            (lambda: vm.send_proc_spawn(1, [b"a\0"], b"", []), ValueError),
            (lambda: vm.send_proc_spawn(1, ["sh"], b"", []), TypeError),
            (lambda: vm.send_proc_spawn(1, [b"sh"], b"rel", []), ValueError),
            (lambda: vm.send_proc_spawn(1, [b"sh"], b"", [], True, 0, 24), ValueError),
            (lambda: vm.send_proc_spawn(1, [b"sh"], b"", [], False, 80, 24), ValueError),
            (lambda: vm.send_proc_spawn(1, [b"sh"], b"", [(b"A=B", b"")]), ValueError),
            (lambda: vm.send_proc_spawn(1, [b"x"] * 257, b"", []), ValueError),
            (lambda: vm.send_proc_read(1, 1, 3, 0, 1, 0), ValueError),
            (lambda: vm.send_proc_read(1, 1, 1, 0, 0, 0), ValueError),
            (lambda: vm.send_proc_read(1, 1, 1, 0, 32769, 0), ValueError),
            (lambda: vm.send_proc_read(1, 1, 1, 0, 1, 60001), ValueError),
            (lambda: vm.send_proc_write(1, 1, b"x" * (60 * 1024 + 1)), ValueError),
            (lambda: vm.send_proc_signal(1, 1, 0), ValueError),
            (lambda: vm.send_proc_signal(1, 1, 65), ValueError),
            (lambda: vm.send_proc_wait(1, 1, 60001), ValueError),
            (lambda: vm.send_proc_resize(1, 1, 1001, 1), ValueError),
            (lambda: vm.send_proc_list(-1), ValueError),
        ]:
            with pytest.raises(exc):
                call()
        assert vm.flush() == 0  # nothing was queued
    finally:
        vm.close()
