"""Guest hardening, proven from inside real VMs by doing the attacks as the user code (uid 1000):
fork bomb, memory bomb, disk fill, signals and ptrace against PID 1, mount, module loading, raw
sockets, other processes in /proc, the network. Where the claim is "the VM keeps answering", the
same VM then runs another request. (Reading the host's files: test_isolation.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from exec_sandbox import Scheduler, limits
from exec_sandbox.images.catalog import load_images
from exec_sandbox.models import Language
from exec_sandbox.paths import images_dir
from exec_sandbox.vm import host_facts
from exec_sandbox.vm.execution import ExecOutcome, ExecRequest
from exec_sandbox.vm.guest import GuestVm
from exec_sandbox.vm.jail import jail_options
from exec_sandbox.vm.spec import VmSpec

pytestmark = pytest.mark.vm

MEMORY_MB = 192


@pytest.fixture
async def guest(images_ready: None) -> AsyncIterator[GuestVm]:
    """One VM started exactly as Scheduler.run starts it, for several requests in a row."""
    khz = host_facts.tsc_khz()
    spec = VmSpec(
        qemu_binary=host_facts.qemu_binary(),
        images=load_images(images_dir()),
        accel=host_facts.accelerator(),
        memory_mb=MEMORY_MB,
        kernel_cmdline_extra=f"tsc_early_khz={khz}" if khz else "",
        jail=jail_options(
            MEMORY_MB, qemu_binary=host_facts.qemu_binary(), accel=host_facts.accelerator()
        ),
        qemu_sandbox=True,
    )
    vm = await GuestVm.boot(spec, registry=None, boot_timeout=limits.BOOT_TIMEOUT_SECONDS)
    try:
        yield vm
    finally:
        vm.close()


async def _exec(
    vm: GuestVm, code: str, language: Language = "python", timeout_ms: int = 20_000
) -> ExecOutcome:
    return await vm.execute(
        ExecRequest(
            language=language,
            code=code.encode(),
            timeout_ms=timeout_ms,
            env=[],
            stdout_limit=limits.STDOUT_LIMIT_BYTES,
            stderr_limit=limits.STDERR_LIMIT_BYTES,
        )
    )


async def _still_answers(vm: GuestVm) -> None:
    after = await _exec(vm, "print('still here')")
    assert (after.exit_code, after.stdout) == (0, "still here\n")


# Every process forks for ever; one that hits the limit retries after 10 ms. The main process
# then counts what it can see (all of it is the user's) and leaves without Python's shutdown.
FORK_BOMB = """
import os, time
if os.fork() == 0:
    os.closerange(0, 3)
    while True:
        try:
            os.fork()
        except OSError:
            time.sleep(0.01)
# Count the user's processes (hidepid=2 shows no others) until the bomb has filled the limit;
# on a loaded host the bomb may need longer than a fixed sleep to get there.
peak, deadline = 0, time.monotonic() + 20
while time.monotonic() < deadline and peak < 250:
    time.sleep(0.2)
    peak = max(peak, sum(1 for p in os.listdir("/proc") if p.isdigit()))
print("alive", peak, flush=True)
os._exit(0)
"""


async def test_fork_bomb_is_contained_and_the_vm_keeps_answering(guest: GuestVm) -> None:
    bomb = await _exec(guest, FORK_BOMB, timeout_ms=30_000)
    # The main process still ran next to the bomb, which RLIMIT_NPROC stopped at 256 processes.
    alive = [line for line in bomb.stdout.splitlines() if line.startswith("alive ")]
    assert alive, bomb
    assert 200 <= int(alive[0].split()[1]) <= 256  # the bomb did fill the limit, and no more
    assert bomb.exit_code == 0
    await _still_answers(guest)
    # Nothing of the bomb survived the run: the user has no process left.
    left = await _exec(guest, "ls /proc | grep -c '^[0-9]'", language="raw")
    assert int(left.stdout) <= 3, left.stdout  # bash, grep, ls


async def test_memory_bomb_ends_in_memory_error_or_oom_kill(guest: GuestVm) -> None:
    one_shot = await _exec(guest, "b = bytearray(8 * 1024 * 1024 * 1024)")
    assert one_shot.exit_code == 1 and "MemoryError" in one_shot.stderr
    creeping = await _exec(guest, "l = []\nwhile True: l.append(bytearray(1 << 20))")
    assert creeping.exit_code == 137 or "MemoryError" in creeping.stderr, creeping
    await _still_answers(guest)


async def test_filling_home_gives_enospc_and_the_agent_keeps_working(guest: GuestVm) -> None:
    fill = await _exec(
        guest,
        "import os\n"
        "with open(os.path.expanduser('~/fill'), 'wb') as f:\n"
        "    try:\n"
        "        while True: f.write(b'x' * (1 << 20)); f.flush()\n"
        "    except OSError as e: print(e.errno == 28, e.strerror)\n",
    )
    assert fill.exit_code == 0, fill
    assert fill.stdout.startswith("True "), fill.stdout
    await _still_answers(guest)


async def test_pid_1_cannot_be_signalled_or_traced(scheduler: Scheduler) -> None:
    result = await scheduler.run(
        "import ctypes, errno, os, signal\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):\n"
        "    try: os.kill(1, sig); print('sent', sig)\n"
        "    except OSError as e: print(errno.errorcode[e.errno])\n"
        "print('ptrace', libc.ptrace(16, 1, 0, 0), errno.errorcode[ctypes.get_errno()])\n"  # ATTACH
        "print('seize', libc.ptrace(0x4206, 1, 0, 0), errno.errorcode[ctypes.get_errno()])\n"
    )
    assert result.stdout == "EPERM\nEPERM\nEPERM\nptrace -1 EPERM\nseize -1 EPERM\n"


async def test_user_code_can_neither_reschedule_the_agent_nor_outrank_it(
    scheduler: Scheduler,
) -> None:
    # The agent runs SCHED_OTHER, user code SCHED_BATCH (guest/src/spawn.c): the agent's
    # wake-ups preempt CPU-bound user code. That holds only while user code cannot change the
    # agent's policy or nice value, nor take a real-time policy or a nice value below the agent's
    # (a higher priority).
    result = await scheduler.run(
        "import errno, os\n"
        "def show(name, call, *args):\n"
        "    try: call(*args); print(name, 'ok')\n"
        "    except OSError as e: print(name, errno.errorcode[e.errno])\n"
        "param = os.sched_param(0)\n"
        "show('agent-other', os.sched_setscheduler, 1, os.SCHED_OTHER, param)\n"
        "show('agent-idle', os.sched_setscheduler, 1, os.SCHED_IDLE, param)\n"
        "show('fifo', os.sched_setscheduler, 0, os.SCHED_FIFO, os.sched_param(1))\n"
        "show('rr', os.sched_setscheduler, 0, os.SCHED_RR, os.sched_param(1))\n"
        "show('nice-up', os.setpriority, os.PRIO_PROCESS, 0, -1)\n"
        "show('agent-nice', os.setpriority, os.PRIO_PROCESS, 1, 19)\n"
        "print(os.sched_getscheduler(1) == os.SCHED_OTHER, os.getpriority(os.PRIO_PROCESS, 1))\n"
    )
    assert result.stdout == (
        "agent-other EPERM\nagent-idle EPERM\nfifo EPERM\nrr EPERM\n"
        "nice-up EACCES\nagent-nice EPERM\nTrue 0\n"
    ), result.stdout


async def test_kill_everything_spares_the_agent(guest: GuestVm) -> None:
    # kill(-1) reaches every process the user may signal but the caller: the background sleep
    # dies, PID 1 is out of reach, and the agent goes on answering.
    out = await _exec(
        guest, 'sleep 60 & pid=$!; kill -KILL -1; wait $pid; echo "sleep: $?"', language="raw"
    )
    assert (out.exit_code, out.stdout) == (0, "sleep: 137\n")
    await _still_answers(guest)


async def test_mount_module_load_and_namespaces_are_denied(scheduler: Scheduler) -> None:
    result = await scheduler.run(
        "import ctypes, errno, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def show(name, rc):\n"
        "    print(name, rc, errno.errorcode.get(ctypes.get_errno()) if rc != 0 else '-')\n"
        "show('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n"
        "show('umount', libc.umount2(b'/proc', 2))\n"
        "show('init_module', libc.syscall(175, None, 0, b''))\n"
        "show('finit_module', libc.syscall(313, 0, b'', 0))\n"
        "show('unshare', libc.unshare(0x10000000 | 0x00020000))\n"  # NEWUSER|NEWNS
        "show('chroot', libc.chroot(b'/tmp'))\n"
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["mount"] == "-1 EPERM"
    assert lines["umount"] == "-1 EPERM"
    # No module support in the guest kernel at all, and no privilege to use it if there were.
    assert lines["init_module"] in ("-1 ENOSYS", "-1 EPERM")
    assert lines["finit_module"] in ("-1 ENOSYS", "-1 EPERM")
    assert lines["unshare"] in ("-1 EPERM", "-1 EINVAL")  # EINVAL: kernel without user namespaces
    assert lines["chroot"] == "-1 EPERM"


async def test_kernel_log_is_not_readable_by_the_user(scheduler: Scheduler) -> None:
    # kernel.dmesg_restrict=1, set by the agent at boot: /dev/kmsg and syslog(2) READ_ALL need
    # CAP_SYSLOG (without it, uid 1000 read both: kernel addresses, boot details).
    result = await scheduler.run(
        "import ctypes, errno, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('restrict', open('/proc/sys/kernel/dmesg_restrict').read().strip())\n"
        "try: os.open('/dev/kmsg', os.O_RDONLY | os.O_NONBLOCK); print('kmsg opened')\n"
        "except OSError as e: print('kmsg', errno.errorcode[e.errno])\n"
        "buf = ctypes.create_string_buffer(4096)\n"
        "rc = libc.klogctl(3, buf, 4096)\n"  # SYSLOG_ACTION_READ_ALL
        "print('read_all', rc, errno.errorcode.get(ctypes.get_errno()) if rc < 0 else buf.raw[:40])\n"  # noqa: E501
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["restrict"] == "1"
    assert lines["kmsg"] == "EPERM"
    assert lines["read_all"] == "-1 EPERM"


async def test_no_raw_sockets_and_no_network_device(scheduler: Scheduler) -> None:
    result = await scheduler.run(
        "import os, socket\n"
        "for fam, typ in ((socket.AF_INET, socket.SOCK_RAW), (socket.AF_PACKET, socket.SOCK_RAW)):\n"  # noqa: E501
        "    try: socket.socket(fam, typ, 1); print('opened')\n"
        "    except OSError as e: print(type(e).__name__, e.errno)\n"
        "print(sorted(os.listdir('/sys/class/net')))\n"
        "print([l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]])\n"
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "PermissionError 1"  # raw IP socket: needs CAP_NET_RAW
    assert lines[1] in ("PermissionError 1", "OSError 97")  # AF_PACKET: EPERM, or not built in
    assert lines[2] == "['lo']"
    assert lines[3] == "['lo']"


async def test_proc_hides_other_users_processes_and_root_is_read_only(scheduler: Scheduler) -> None:
    result = await scheduler.run(
        "import os\n"
        "mine = {str(os.getpid())}\n"
        "others = [p for p in os.listdir('/proc') if p.isdigit() and p not in mine]\n"
        "print('others', others)\n"
        "print('pid1', os.path.exists('/proc/1'))\n"
        "for path in ('/usr/bin/evil', '/etc/passwd', '/sbx-agent'):\n"
        "    try: open(path, 'w'); print('wrote', path)\n"
        "    except OSError as e: print(e.errno)\n"
        "sizes = {l.split()[1]: l.split()[3] for l in open('/proc/mounts') if l.startswith('tmpfs')}\n"  # noqa: E501
        "print(all('size=' in o for o in sizes.values()), sorted(sizes))\n"
        "disk = sorted((l.split()[1], l.split()[3]) for l in open('/proc/mounts') if ' ext4 ' in l)\n"  # noqa: E501
        "print([(m, 'nosuid' in o and 'nodev' in o) for m, o in disk])\n"
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "others []"
    assert lines[1] == "pid1 False"
    assert lines[2:5] == ["30", "30", "30"]  # EROFS
    assert lines[5] == "True ['/dev/shm', '/run']"
    # The workspace: a disk of its own, as capped (disk_mb) as the tmpfs were (docs/design.md).
    assert lines[6] == "[('/home/user', True), ('/run/sbx-work', True), ('/tmp', True)]"
