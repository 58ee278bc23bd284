"""Process and fd inspection shared by the tests (reads /proc; no VM logic here), and the
configuration of a scheduler whose caches are a test's own."""

from __future__ import annotations

import os
from pathlib import Path

from exec_sandbox import SchedulerConfig


def private_config(tmp_path: Path, **overrides: object) -> SchedulerConfig:
    """A small scheduler whose package, template and snapshot caches live under tmp_path (a
    test sees its own builds and snapshots, never the user's), memory snapshots off unless
    asked for."""
    options: dict[str, object] = {
        "max_concurrent_vms": 3,
        "memory_snapshots": False,
        "package_cache_dir": tmp_path / "packages",
        "memory_snapshot_cache_dir": tmp_path / "memory",
        "template_cache_dir": tmp_path / "templates",
    }
    options.update(overrides)
    return SchedulerConfig(**options)  # type: ignore[arg-type]


def processes(name: str, parent: int | None = None) -> list[int]:
    """PIDs of live processes whose command name starts with name, optionally only the
    children of `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # comm is in parentheses and may contain spaces: split after the last ')'.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        state, ppid = fields[0], int(fields[1])
        if not comm.startswith(name) or state == "Z":
            continue
        if parent is None or ppid == parent:
            found.append(int(entry.name))
    return found


def qemu_processes(parent: int | None = None) -> list[int]:
    """PIDs of live qemu-system processes, optionally only the children of `parent`."""
    return processes("qemu-system", parent)


def open_fds() -> set[str]:
    """What this process's fds point to (socket:[..], pipe:[..], paths)."""
    result = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            result.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return result


# Live packages (the host's package index, as in test_packages_live.py): wheels for the guest's
# python 3.13, for the rich-output tests. Importing them under TCG takes seconds, hence the
# timeout.
MATPLOTLIB = "matplotlib==3.9.2"
PANDAS = "pandas==2.2.3"
PACKAGE_TIMEOUT_SECONDS = 240


def node_blob_wanted() -> bool:
    """The images' node lacks node's built-in startup snapshot, so that javascript templates
    and cold boots give it a user-land blob (snapshots/node_startup.wanted)."""
    from exec_sandbox.images.catalog import load_images
    from exec_sandbox.paths import images_dir

    try:
        facts = load_images(images_dir()).guest
    except Exception:
        return True  # no images: the VM tests fail on their own (images_ready)
    return facts is None or not facts.node_snapshot
