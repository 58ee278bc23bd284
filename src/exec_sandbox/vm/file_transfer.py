"""File transfer between the host and a session's guest home (/home/user).

Paths are checked lexically here, before anything is sent (InputValidationError), and resolved
again by the guest agent without following symlinks. Content moves in chunks in both directions,
with flow control on the way in, so that a file of hundreds of MB never sits whole in host memory.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, TypeVar

from ..errors import GuestAgentError, InputValidationError, SandboxError
from ..models import FileInfo
from . import binding
from .binding import FILE_SIZE_MAX, PATH_COMPONENT_MAX, PATH_MAX
from .guest import FileTransfer, GuestFileError, GuestVm

GUEST_HOME = "/home/user"
# Host -> guest chunk size, and how much may wait in the channel's queue before the next chunk.
WRITE_CHUNK = 256 * 1024
_QUEUE_HIGH_WATER = 1024 * 1024
# A transfer with no progress for this long means the guest (or its QEMU) stalled: the VM is
# closed and the call raises GuestAgentError. Progress is checked 8 times per period, so a stall
# is found between 120 and 135 s after the last byte moved.
_STALL_SECONDS = 120.0

_T = TypeVar("_T")

Content = bytes | bytearray | memoryview | Path | IO[bytes]
Destination = Path | IO[bytes]


def guest_path(path: object, *, allow_empty: bool = False) -> bytes:
    """The path relative to the guest home, as the agent expects it; or InputValidationError."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise InputValidationError(f"path must be a str, got {type(path).__name__}")
    if "\x00" in path:
        raise InputValidationError("path contains a NUL byte")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InputValidationError(f"path {path!r} is not valid UTF-8") from None
    if len(encoded) > PATH_MAX:
        raise InputValidationError(f"path is {len(encoded)} bytes, more than {PATH_MAX}")
    relative = path
    if path.startswith("/"):
        if path != GUEST_HOME and not path.startswith(GUEST_HOME + "/"):
            raise InputValidationError(f"path {path!r} is outside {GUEST_HOME}")
        relative = path[len(GUEST_HOME) :]
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    for part in parts:
        if part == "..":
            raise InputValidationError(f"path {path!r} contains '..'")
        if len(part.encode("utf-8")) > PATH_COMPONENT_MAX:
            raise InputValidationError(
                f"path component {part[:32]!r}... is longer than {PATH_COMPONENT_MAX} bytes"
            )
    if not parts and not allow_empty:
        raise InputValidationError(f"path {path!r} names the home directory, not a file")
    return "/".join(parts).encode("utf-8")


class ContentRefused(SandboxError):
    """The guest would not take what was written (FILE_ERR_REFUSED: node's startup snapshot
    behind another CPU's tag, snapshots/node_startup.py)."""


def _raise_for(exc: GuestFileError, path: bytes) -> None:
    shown = path.decode("utf-8", "replace") or "."
    if exc.kind == binding.FILE_ERR_REFUSED:
        raise ContentRefused(str(exc)) from None
    if exc.kind == binding.FILE_ERR_PATH:
        raise InputValidationError(f"{shown}: {exc}") from None
    if exc.kind == binding.FILE_ERR_NOT_FOUND:
        raise FileNotFoundError(f"{shown} in the guest home: {exc}") from None
    if exc.kind == binding.FILE_ERR_TOO_LARGE:
        raise InputValidationError(f"{shown}: {exc}") from None
    if exc.kind == binding.FILE_ERR_PROTOCOL:
        raise GuestAgentError(f"file transfer out of sequence: {exc}") from None
    raise SandboxError(f"{shown}: {exc}") from None


async def _unless_stalled(vm: GuestVm, step: Awaitable[_T], progress: Callable[[], int]) -> _T:
    """Await step while progress() keeps changing; after _STALL_SECONDS without a change, close
    the VM and raise GuestAgentError (the session then reports itself closed)."""
    loop = asyncio.get_running_loop()
    future = asyncio.ensure_future(step)
    last, since = progress(), loop.time()
    try:
        while True:
            await asyncio.wait({future}, timeout=_STALL_SECONDS / 8)
            if future.done():
                return future.result()
            now = progress()
            if now != last:
                last, since = now, loop.time()
            elif loop.time() - since >= _STALL_SECONDS:
                vm.close()
                raise GuestAgentError(
                    f"the guest made no progress on a file transfer for {_STALL_SECONDS:.0f} s "
                    "(stalled guest or QEMU): the VM was closed"
                )
    finally:
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: the caller has its own error


async def _settle(vm: GuestVm, transfer: FileTransfer, progress: Callable[[], int]) -> int:
    """Wait for FILE_DONE/FILE_ERROR, as long as the transfer keeps moving."""
    return await _unless_stalled(vm, asyncio.shield(transfer.done), progress)


async def write_file(vm: GuestVm, path: bytes, content: Content, make_executable: bool) -> int:
    """Stream content to path (atomically replaced in the guest). Returns the bytes written."""
    return await write_target(vm, path, content, binding.FILE_EXECUTABLE if make_executable else 0)


async def write_target(vm: GuestVm, path: bytes, content: Content, flags: int) -> int:
    """write_file() with the FILE_WRITE_BEGIN flags as given (snapshots/node_startup.py names node's
    startup snapshot by a flag and no path)."""
    if isinstance(content, Path):
        source = await asyncio.to_thread(content.open, "rb")
        try:
            return await write_target(vm, path, source, flags)
        finally:
            source.close()
    transfer = vm.open_transfer()
    sent = 0
    committed = False
    try:
        vm.send_file_frame("write_begin", transfer.id, path, flags)
        async for chunk in _chunks(content):
            sent += len(chunk)
            if sent > FILE_SIZE_MAX:
                raise InputValidationError(f"content is larger than {FILE_SIZE_MAX} bytes")
            if transfer.done.done():
                break  # the guest refused: stop sending, the error is raised below
            if vm.send_file_frame("write_data", transfer.id, chunk) > (_QUEUE_HIGH_WATER):
                await _unless_stalled(vm, vm.wait_flushed(), lambda: vm.bytes_flushed)
        committed = not transfer.done.done()
        vm.send_file_frame("write_end", transfer.id, committed)
        if not committed:
            await transfer.done  # raises the guest's error
        return await _settle(vm, transfer, lambda: vm.bytes_flushed)
    except GuestFileError as exc:
        _raise_for(exc, path)
        raise  # not reached
    except BaseException:
        if not committed and vm.alive:
            # Reading the source failed (or the caller gave up): the guest drops the temp file.
            vm.send_file_frame("write_end", transfer.id, False)
        raise
    finally:
        vm.close_transfer(transfer)


async def _chunks(
    content: bytes | bytearray | memoryview | IO[bytes],
) -> AsyncIterator[bytes | bytearray | memoryview]:
    """content in WRITE_CHUNK pieces. A file is read in an executor thread: a read from a cold
    disk or a network file system must not hold the loop."""
    if isinstance(content, (bytes, bytearray, memoryview)):
        view = memoryview(content).cast("B")
        if len(view) > FILE_SIZE_MAX:
            raise InputValidationError(f"content is larger than {FILE_SIZE_MAX} bytes")
        for start in range(0, len(view), WRITE_CHUNK):
            yield view[start : start + WRITE_CHUNK]
        return
    read = getattr(content, "read", None)
    if read is None:
        raise InputValidationError(
            f"content must be bytes, a Path or a binary file object, got {type(content).__name__}"
        )
    while True:
        chunk = await asyncio.to_thread(read, WRITE_CHUNK)
        if not chunk:
            return
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise InputValidationError("content.read() must return bytes (open the file in 'rb')")
        yield chunk


async def read_file(vm: GuestVm, path: bytes, destination: Destination | None) -> bytes | None:
    """Stream path from the guest into destination, or into the returned bytes."""
    return await read_target(vm, path, destination, 0, FILE_SIZE_MAX)


async def read_target(
    vm: GuestVm, path: bytes, destination: Destination | None, flags: int, limit: int
) -> bytes | None:
    """read_file() with the FILE_READ flags as given; the VM is closed when the guest sends more
    than limit bytes."""
    if isinstance(destination, Path):
        # Written beside the target and renamed: a failed read leaves no partial file.
        partial = destination.with_name(f".{destination.name}.partial-{os.getpid()}")
        try:
            with partial.open("wb") as sink:
                await read_target(vm, path, sink, flags, limit)
            partial.replace(destination)
        finally:
            partial.unlink(missing_ok=True)
        return None
    parts: list[bytes] = []
    received = 0

    def on_data(data: bytes) -> None:
        nonlocal received
        received += len(data)
        if received > limit:
            vm.close()
            raise GuestAgentError(f"guest sent more than {limit} bytes for one file")
        if destination is None:
            parts.append(data)
        else:
            destination.write(data)

    transfer = vm.open_transfer(on_data=on_data)
    try:
        vm.send_file_frame("read", transfer.id, path, flags)
        total = await _settle(vm, transfer, lambda: received)
    except GuestFileError as exc:
        _raise_for(exc, path)
        raise
    finally:
        vm.close_transfer(transfer)
    if total != received:
        vm.close()
        raise GuestAgentError(f"guest announced {total} bytes but sent {received}")
    return b"".join(parts) if destination is None else None


async def list_files(vm: GuestVm, path: bytes) -> list[FileInfo]:
    entries: list[FileInfo] = []

    def on_entries(batch: list[binding.FileEntry]) -> None:
        for e in batch:
            entries.append(FileInfo(e.name.decode("utf-8", "replace"), e.is_dir, e.size))

    transfer = vm.open_transfer(on_entries=on_entries)
    try:
        vm.send_file_frame("list", transfer.id, path)
        total = await _settle(vm, transfer, lambda: len(entries))
    except GuestFileError as exc:
        _raise_for(exc, path)
        raise
    finally:
        vm.close_transfer(transfer)
    if total != len(entries):
        vm.close()
        raise GuestAgentError(f"guest announced {total} entries but sent {len(entries)}")
    return sorted(entries, key=lambda e: e.name)
