"""Shared by the framework tests: they use the integrations' own shared background scheduler,
so the leak check is per test: no QEMU child may outlive the test's own close()."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.helpers import qemu_processes

# What only the guest shows: its hostname is "sandbox" and the code runs as uid 1000, whatever
# the host (the tests assert the host differs, so the output cannot come from a host process).
GUEST_PROOF_CODE = "import os; print(os.uname().nodename, os.getuid(), 6 * 7)"
GUEST_PROOF_OUTPUT = "sandbox 1000 42"


def assert_no_vm_left() -> None:
    # VM teardown is asynchronous on the background loop: give it a moment.
    deadline = time.monotonic() + 10
    while qemu_processes(parent=os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert qemu_processes(parent=os.getpid()) == [], "a VM outlived its owner"


@pytest.fixture(autouse=True)
def no_vm_leak(request: pytest.FixtureRequest, images_ready: None) -> Iterator[None]:
    assert (os.uname().nodename, os.getuid()) != ("sandbox", 1000), "the host looks like the guest"
    yield
    # The standard sandbox suite shares one VM per class; its fixture checks at class end.
    if "sandbox" not in request.fixturenames:
        assert_no_vm_left()


def _png_1x1() -> bytes:
    """A valid one-pixel PNG, made here so that no image library is needed on either side."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


PNG_1X1 = _png_1x1()
# Code that shows a figure the IPython way (an object with _repr_png_), as a chart library's
# figure would: no savefig, no file.
SHOW_PNG_CODE = (
    "import base64\n"
    "class Chart:\n"
    "    def _repr_png_(self):\n"
    f"        return base64.b64decode({__import__('base64').b64encode(PNG_1X1).decode()!r})\n"
    "    def __repr__(self):\n"
    "        return 'Chart()'\n"
    "display(Chart())\n"
    "print('shown')\n"
)
