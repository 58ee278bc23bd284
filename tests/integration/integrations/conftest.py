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
