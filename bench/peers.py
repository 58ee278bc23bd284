"""Side by side with what users would pick instead, in one run on this machine, interleaved call
by call (each round runs every path once, in a shuffled order) so that every row sees the same
load:

* us: `run()` through the warm pool, an L1 restore and a cold boot; a session `exec`; `fork()`
  of that session;
* containers: `docker run --rm` and `podman run --rm` of a local image imported from the same
  Debian package tree as our root image (`rootfs-tree-*` in the images directory; no registry),
  `--network none`; `docker exec` / `podman exec` into a running container (the analogue of a
  session exec);
* process sandboxes: bubblewrap with a read-only bind of the same tree and new net, pid, ipc
  and uts namespaces; the host process itself (the floor: Debian's /usr/bin interpreters).

KVM-only peers (microsandbox, BoxLite, Firecracker) are listed with why they did not run. The
bench installs docker.io, podman and bubblewrap through apt-get when they are missing
(`--no-install` skips that: a missing peer becomes a row saying why), starts the docker daemon
when none answers (and stops it again), and removes every container and image it made.

    .venv/bin/python bench/peers.py --runs 10
    .venv/bin/python bench/peers.py --runs 5 --languages python --no-install
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import config, percentile

from exec_sandbox import Scheduler
from exec_sandbox.images.catalog import load_images
from exec_sandbox.paths import images_dir
from exec_sandbox.session import Session
from exec_sandbox.vm import host_facts

# language: (the code we run, the argv a container or process runs). Both print "1\n".
CASES: dict[str, tuple[str, list[str]]] = {
    "python": ("print(1)", ["python3", "-c", "print(1)"]),
    "javascript": ("console.log(1)", ["node", "-e", "console.log(1)"]),
    "raw": ("echo 1", ["bash", "-c", "echo 1"]),
}
# The floor: Debian's own interpreters, not whatever shim comes first on PATH (a pyenv shim adds
# tens of ms to `python3 -c`).
HOST_BIN = Path("/usr/bin")
# apt package: the commands that show it is there.
PACKAGES = {"docker.io": ("dockerd",), "podman": ("podman",), "bubblewrap": ("bwrap",)}
KVM_PEERS = ("microsandbox", "BoxLite", "Firecracker")
OWN_KERNEL = "own kernel (QEMU, TCG)"
SHARED = "shared kernel"
LABEL = f"exec-sandbox-bench=peers-{os.getpid()}"
TAG = f"sbx-peers:{os.getpid()}"

Call = Callable[[], Awaitable[float]]


@dataclass
class Row:
    """One path of a table: its samples, or why it did not run."""

    label: str
    isolation: str
    call: Call | None = None
    why_not: str = ""
    samples: list[float] = field(default_factory=list)


@dataclass
class Engine:
    """docker or podman: the client's argv (global flags included) and what the bench made."""

    name: str
    cli: list[str]
    mode: str  # "root" or "rootless", and what runs the containers
    container: str = ""  # the running container `exec` goes into

    def run_flags(self) -> list[str]:
        # podman raises nofile and nproc in every container by default, which needs
        # CAP_SYS_RESOURCE: root on a shared host may lack it ("error setting rlimit type 7").
        # Small limits any host allows (a print(1) needs neither); docker sets none.
        ulimit = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
        ulimit = ulimit if self.name == "podman" else []
        return ["--network", "none", "--label", LABEL, *ulimit]

    def run_argv(self, argv: Sequence[str]) -> list[str]:
        return [*self.cli, "run", "--rm", *self.run_flags(), TAG, *argv]

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        return [*self.cli, "exec", self.container, *argv]


# --- running things ------------------------------------------------------------------------


def quiet(argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run argv to its end, output captured (the bench's own output is the tables)."""
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


def why(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return f"exit {proc.returncode}: {lines[-1] if lines else 'no output'}"


async def spawn_ms(argv: Sequence[str]) -> float:
    """Wall time of argv from spawn to exit; it must print exactly "1\\n"."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    ms = (time.perf_counter() - started) * 1000
    if proc.returncode != 0 or out != b"1\n":
        raise RuntimeError(f"{argv}: exit {proc.returncode}, stdout {out!r}, stderr {err[-300:]!r}")
    return ms


# --- what is there, and installing the rest ------------------------------------------------


def install_missing(install: bool) -> None:
    missing = [pkg for pkg, tools in PACKAGES.items() if not all(map(shutil.which, tools))]
    if not missing:
        return
    if not install:
        print(f"missing, not installed (--no-install): {' '.join(missing)}")
        return
    if os.geteuid() != 0:
        print(f"missing, not installed (apt-get needs root): {' '.join(missing)}")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    print(f"apt-get install {' '.join(missing)} ...", flush=True)
    done = quiet(argv, env=env)
    if done.returncode != 0:  # stale or absent package lists: update once and retry
        quiet(["apt-get", "update", "-q"], env=env)
        done = quiet(argv, env=env)
    print(f"  {'installed' if done.returncode == 0 else 'failed: ' + why(done)}")


def kvm_unusable() -> str | None:
    """Why KVM cannot run guest code here (None: it can): the same probe the library uses."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        return f"/dev/kvm: {exc.strerror}"
    return host_facts.probe_accelerator(host_facts.qemu_binary(), "kvm")


def package_tree() -> Path:
    """The unpacked Debian tree our root image was packed from (named in the image's facts)."""
    images = load_images(images_dir())
    if images.guest is not None:
        tree = images.rootfs.parent / f"rootfs-tree-{images.guest.tree}"
        if tree.is_dir():
            return tree
    trees = sorted(images.rootfs.parent.glob("rootfs-tree-*"), key=lambda p: p.stat().st_mtime)
    if not trees:
        raise SystemExit("no rootfs-tree-* beside the root image: run `sbx setup`")
    return trees[-1]


# --- containers ----------------------------------------------------------------------------


def docker_client() -> str | None:
    """The client beside dockerd (Debian's), not another one earlier on PATH."""
    daemon = shutil.which("dockerd")
    if daemon is None:
        return None
    beside = Path(daemon).with_name("docker")
    return str(beside) if beside.is_file() else shutil.which("docker")


def start_docker_daemon(client: str, log: Path) -> subprocess.Popen[bytes] | None:
    """None when a daemon answers already; else start dockerd (its own session, so that a
    Ctrl-C reaches the bench and not the daemon the cleanup still needs) and wait for it. Its
    containers run with --network none, so it gets no bridge and writes no iptables rules:
    nothing of it outlives the run."""
    if quiet([client, "info"]).returncode == 0:
        return None
    with log.open("wb") as sink:
        daemon = subprocess.Popen(
            ["dockerd", "--bridge=none", "--iptables=false"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while quiet([client, "info"]).returncode != 0:
        if daemon.poll() is not None or time.monotonic() > deadline:
            stop_daemon(daemon)
            tail = log.read_text(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"dockerd did not come up: {' '.join(tail)}")
        time.sleep(0.5)
    return daemon


def stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is None:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def podman_cli() -> list[str] | None:
    podman = shutil.which("podman")
    if podman is None:
        return None
    if Path("/run/systemd/system").is_dir():
        return [podman]
    # No systemd here: cgroups managed directly, events to a file instead of the journal.
    return [podman, "--cgroup-manager=cgroupfs", "--events-backend=file"]


def import_tree(engine: Engine, tree: Path) -> float:
    """`<engine> import` of the tree, streamed as a tarball through a pipe; seconds taken."""
    started = time.perf_counter()
    tar = subprocess.Popen(
        ["tar", "-C", str(tree), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE
    )
    done = quiet([*engine.cli, "import", "-", TAG], stdin=tar.stdout)
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or done.returncode != 0:
        raise RuntimeError(f"{engine.name} import: {why(done)}")
    return time.perf_counter() - started


def start_idle_container(engine: Engine) -> None:
    done = quiet([*engine.cli, "run", "-d", *engine.run_flags(), TAG, "sleep", "infinity"])
    if done.returncode != 0:
        raise RuntimeError(f"{engine.name} run -d: {why(done)}")
    engine.container = done.stdout.strip()


def remove_everything(engine: Engine) -> None:
    """Every container labelled by this run (also a `run --rm` cut short), then the image."""
    listed = quiet([*engine.cli, "ps", "-aq", "--filter", f"label={LABEL}"]).stdout.split()
    if listed:
        quiet([*engine.cli, "rm", "-f", *listed])
    quiet([*engine.cli, "rmi", "-f", TAG])


def engine_facts(engine: Engine) -> str:
    """Version, OCI runtime and storage driver, as the engine reports them."""
    if engine.name == "docker":
        fmt = "{{.ServerVersion}}, runtime {{.DefaultRuntime}}, storage {{.Driver}}"
    else:
        fmt = (
            "{{.Version.Version}}, runtime {{.Host.OCIRuntime.Name}}, "
            "storage {{.Store.GraphDriverName}}"
        )
    return quiet([*engine.cli, "info", "--format", fmt]).stdout.strip()


@contextlib.contextmanager
def engines(tree: Path, tmp: Path) -> Iterator[dict[str, Engine | str]]:
    """docker and podman with the tree imported and an idle container each, or why not. On the
    way out (an error or Ctrl-C too): their containers and images removed, and the docker
    daemon stopped if this started it."""
    found: dict[str, Engine | str] = {}
    daemon: subprocess.Popen[bytes] | None = None
    made: list[Engine] = []
    mode = "root" if os.geteuid() == 0 else "rootless"
    try:
        client = docker_client()
        podman = podman_cli()
        candidates: list[tuple[str, list[str] | None, str]] = [
            ("docker", [client] if client else None, "docker.io is not installed (no dockerd)"),
            ("podman", podman, "podman is not installed"),
        ]
        for name, cli, missing in candidates:
            if cli is None:
                found[name] = missing
                continue
            engine = Engine(name, cli, mode)
            try:
                if name == "docker":
                    daemon = start_docker_daemon(cli[0], tmp / "dockerd.log")
                made.append(engine)
                seconds = import_tree(engine, tree)
                start_idle_container(engine)
                print(f"{name} {engine_facts(engine)}, as {mode}: tree imported in {seconds:.0f} s")
                found[name] = engine
            except RuntimeError as exc:
                found[name] = str(exc)
        yield found
    finally:
        for engine in made:
            remove_everything(engine)
        if daemon is not None:
            stop_daemon(daemon)
            print("docker daemon stopped (this run started it)")


# --- us ------------------------------------------------------------------------------------


@dataclass
class Us:
    pool: Scheduler  # a warm pool of one VM per language
    l1: Scheduler  # pool off: every run() is an L1 restore
    cold: Scheduler  # snapshots off: every run() boots


def our_rows(us: Us, session: Session, language: str) -> list[Row]:
    code = CASES[language][0]

    async def run_ms(sched: Scheduler, served: str) -> float:
        started = time.perf_counter()
        result = await sched.run(code, language=language)  # type: ignore[arg-type]
        ms = (time.perf_counter() - started) * 1000
        path = "pool" if result.warm_pool_hit else "l1" if result.l1_cache_hit else "cold"
        assert result.stdout == "1\n" and path == served, (served, result)
        return ms

    async def pool_hit() -> float:
        ms = await run_ms(us.pool, "pool")
        # The refill runs now, not beside the next path's call; then idle, as a pool VM is.
        await us.pool.wait_pool_ready(timeout=300)
        await asyncio.sleep(0.5)
        return ms

    async def session_exec() -> float:
        started = time.perf_counter()
        result = await session.exec(code)
        ms = (time.perf_counter() - started) * 1000
        assert result.stdout == "1\n", result
        return ms

    async def fork() -> float:
        started = time.perf_counter()
        copy = await session.fork()
        ms = (time.perf_counter() - started) * 1000
        assert isinstance(copy, Session)
        await copy.close()
        return ms

    return [
        Row("us: run(), warm-pool hit", OWN_KERNEL, pool_hit),
        Row("us: run(), L1 restore", OWN_KERNEL, lambda: run_ms(us.l1, "l1")),
        Row("us: run(), cold boot", OWN_KERNEL, lambda: run_ms(us.cold, "cold")),
        Row("us: session exec", OWN_KERNEL, session_exec),
        Row("us: session fork()", OWN_KERNEL, fork),
    ]


# --- the others ----------------------------------------------------------------------------


def bwrap_argv(tree: Path, argv: Sequence[str]) -> list[str]:
    return [
        "bwrap",
        *("--ro-bind", str(tree), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"),
        *("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"),
        *("--die-with-parent", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"),
        *("--setenv", "HOME", "/tmp", *argv),
    ]


def peer_rows(
    language: str, tree: Path, found: dict[str, Engine | str], kvm: str | None
) -> list[Row]:
    argv = CASES[language][1]
    rows: list[Row] = []
    for name in ("docker", "podman"):
        engine = found[name]
        runc = f"{SHARED}: namespaces + cgroups"
        if isinstance(engine, str):
            rows += [Row(f"{name} run --rm", runc, why_not=engine)]
            rows += [Row(f"{name} exec", runc, why_not=engine)]
            continue
        run, exec_ = engine.run_argv(argv), engine.exec_argv(argv)
        rows.append(Row(f"{name} run --rm", runc, lambda a=run: spawn_ms(a)))  # type: ignore[misc]
        rows.append(Row(f"{name} exec", runc, lambda a=exec_: spawn_ms(a)))  # type: ignore[misc]
    ns = f"{SHARED}: namespaces"
    if shutil.which("bwrap"):
        rows.append(Row("bwrap", ns, lambda: spawn_ms(bwrap_argv(tree, argv))))
    else:
        rows.append(Row("bwrap", ns, why_not="bubblewrap is not installed"))
    host = [str(HOST_BIN / argv[0]), *argv[1:]]
    rows.append(Row("host process", "none: the floor", lambda: spawn_ms(host)))
    for name in KVM_PEERS:
        reason = f"needs KVM: {kvm}" if kvm else "not installed by this bench"
        rows.append(Row(name, "own kernel (KVM)", why_not=reason))
    return rows


# --- one table per language ----------------------------------------------------------------


async def measure(rows: list[Row], runs: int) -> None:
    """One untimed round (first calls pay for page cache, a first restore's checks), then runs
    rounds, every row once per round in a shuffled order."""
    live = [row for row in rows if row.call is not None]
    order = random.Random(0)
    for round_ in range(runs + 1):
        order.shuffle(live)
        for row in live:
            assert row.call is not None
            ms = await row.call()
            if round_ > 0:
                row.samples.append(ms)


def table(language: str, rows: list[Row]) -> None:
    by_label = {row.label: row for row in rows}

    def p50(label: str) -> float | None:
        row = by_label.get(label)
        return percentile(row.samples, 50) if row and row.samples else None

    docker, host = p50("docker run --rm"), p50("host process")
    print(f"\n== {language}: {CASES[language][0]!r} ({' '.join(CASES[language][1][:2])} ...) ==")
    print(f"{'path':<26} {'isolation':<34} {'p50 ms':>8} {'p95 ms':>8} {'/docker':>8} {'/host':>8}")
    for row in rows:
        if not row.samples:
            print(f"{row.label:<26} {row.isolation:<34} not run: {row.why_not}")
            continue
        mid, high = percentile(row.samples, 50), percentile(row.samples, 95)
        to_docker = f"{mid / docker:7.2f}x" if docker else f"{'-':>8}"
        to_host = f"{mid / host:7.1f}x" if host else f"{'-':>8}"
        print(f"{row.label:<26} {row.isolation:<34} {mid:8.1f} {high:8.1f} {to_docker} {to_host}")


async def main(runs: int, languages: list[str], install: bool) -> None:
    install_missing(install)
    tree = package_tree()
    kvm = kvm_unusable()
    load = os.getloadavg()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; load {load[0]:.2f}; cores {os.cpu_count()}; "
        f"accelerator {host_facts.accelerator()}; KVM: {kvm or 'usable'}; {runs} runs per path"
    )
    print(f"tree: {tree} ({quiet(['du', '-sh', str(tree)]).stdout.split()[0]})")
    versions = [quiet([str(HOST_BIN / t), "--version"]).stdout.strip() for t in ("python3", "node")]
    print(f"host floor: {HOST_BIN}/: {', '.join(versions)}, bash")
    with tempfile.TemporaryDirectory(prefix="sbx-peers-") as tmp_name:
        tmp = Path(tmp_name)
        with engines(tree, tmp) as found:
            await measure_all(tmp, tree, found, kvm, runs, languages)
    load = os.getloadavg()
    print(f"\nload at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


async def measure_all(
    tmp: Path,
    tree: Path,
    found: dict[str, Engine | str],
    kvm: str | None,
    runs: int,
    languages: list[str],
) -> None:
    cache = tmp / "snapshots"
    async with contextlib.AsyncExitStack() as stack:
        l1 = await stack.enter_async_context(Scheduler(config(cache, warm_pool_size=0)))
        for language in languages:  # built once, in this scheduler; the pool's finds them
            assert await l1.prepare_snapshot(language)  # type: ignore[arg-type]
        pool = await stack.enter_async_context(
            Scheduler(config(cache, warm_pool_size=dict.fromkeys(languages, 1)))
        )
        cold = await stack.enter_async_context(
            Scheduler(config(tmp / "cold", warm_pool_size=0, memory_snapshots=False))
        )
        await pool.wait_pool_ready(timeout=600)
        us = Us(pool, l1, cold)
        for language in languages:
            async with await l1.session(language=language) as session:  # type: ignore[arg-type]
                rows = our_rows(us, session, language) + peer_rows(language, tree, found, kvm)
                await measure(rows, runs)
            table(language, rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--languages", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument(
        "--no-install", action="store_true", help="do not apt-get install missing peers"
    )
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.languages, not args.no_install))
