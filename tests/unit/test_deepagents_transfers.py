"""The Deep Agents backend's batched transfers without a VM: the guest scripts run here on the
host against a temporary directory, the guest's reports are read as untrusted input, batches
stay within their bounds, and a timeout over our limit is clamped with a note."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepagents", reason="the deepagents extra is not installed")

from exec_sandbox.integrations import _sandbox_files as files
from exec_sandbox.integrations.deepagents import _command_timeout
from exec_sandbox.limits import MAX_TIMEOUT_SECONDS


def _run(script: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_upload_script_places_each_file_and_reports_each(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("x")
    batch = [
        (0, str(tmp_path / "deep/er/one.bin"), bytes(range(256))),
        (1, str(tmp_path), b"dir"),  # a directory
        (2, str(tmp_path / "a_file/child"), b"under a file"),
        (3, str(tmp_path / "empty"), b""),
        (4, str(tmp_path / "deep/two.txt"), "é\n".encode()),
    ]
    blob = tmp_path / "blob"
    blob.write_bytes(files.upload_blob(batch))
    report = files.parse_upload_report("\n".join(_run(files.UPLOAD_SCRIPT, str(blob))), 5)
    assert report == [None, "is_directory", "invalid_path", None, None]
    assert (tmp_path / "deep/er/one.bin").read_bytes() == bytes(range(256))
    assert (tmp_path / "empty").read_bytes() == b""
    assert (tmp_path / "deep/two.txt").read_bytes() == "é\n".encode()
    assert not blob.exists()  # the staged blob is removed


def test_download_script_copies_and_defers_beyond_its_cap(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"A" * 10)
    (tmp_path / "b").write_bytes(b"")
    (tmp_path / "c").write_bytes(b"C" * 10)
    locked = tmp_path / "locked"
    locked.write_bytes(b"secret")
    locked.chmod(0)
    # root reads a mode-0 file anyway: the permission case is only seen as another user.
    denied = [str(locked)] if os.geteuid() != 0 else []
    paths = [str(tmp_path / "missing"), *denied, str(tmp_path)]
    paths += [str(tmp_path / n) for n in ("b", "a", "c")]
    blob = tmp_path / "blob"
    encoded = files.download_command("x", paths).rsplit(" ", 1)[1]
    lines = _run(files.DOWNLOAD_SCRIPT, str(blob), "5", encoded)
    report = files.parse_download_report("\n".join(lines), len(paths))
    # a takes the blob past its 5-byte cap, so c waits for the next batch (None).
    expected = ["file_not_found", *(["permission_denied"] if denied else []), "is_directory"]
    assert report == [*expected, 0, 10, None]
    assert blob.read_bytes() == b"A" * 10


def test_reports_are_read_as_untrusted() -> None:
    assert files.parse_upload_report('null\n"permission_denied"\n[1]\nnot json', 5) == [
        None,
        "permission_denied",
        "unknown error",
        "unknown error",
        "the sandbox did not report this file",
    ]
    lines = [{"size": 3}, {"size": True}, {"size": -1}, {"error": ""}, {"defer": True}, [], "x"]
    assert files.parse_download_report("\n".join(json.dumps(x) for x in lines), 8) == [
        3,
        "unknown error",
        "unknown error",
        "unknown error",
        None,
        "unknown error",
        "unknown error",
        "the sandbox did not report this file",
    ]


def test_batches_are_bounded() -> None:
    big = files.BATCH_BYTES // 2 + 1
    items = [(i, f"/f{i}", b"x" * big) for i in range(3)] + [(3, "/small", b"y")]
    batches = list(files.upload_batches(items))
    assert [[i for i, _, _ in b] for b in batches] == [[0], [1], [2, 3]]
    paths = [(i, "/" + "p" * 4000) for i in range(40)]
    path_batches = list(files.path_batches(paths))
    assert len(path_batches) > 1 and sum(map(len, path_batches)) == 40
    assert all(
        len(files.download_command("s", [p for _, p in b])) < 128 * 1024 for b in path_batches
    )


def test_timeouts_within_our_limit_pass_through_and_above_it_are_clamped_with_a_note() -> None:
    assert _command_timeout(120, None) == (120, "")
    assert _command_timeout(120, 7) == (7, "")
    assert _command_timeout(120, MAX_TIMEOUT_SECONDS) == (MAX_TIMEOUT_SECONDS, "")
    assert _command_timeout(120, 3600) == (3600, "")
    assert _command_timeout(120, 0) == (0, "")  # deepagents' "no limit" is ours too
    seconds, note = _command_timeout(120, MAX_TIMEOUT_SECONDS + 1)
    assert seconds == MAX_TIMEOUT_SECONDS and f"{MAX_TIMEOUT_SECONDS + 1} s is above" in note
