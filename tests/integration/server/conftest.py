"""One `sbx serve` per test module (starting one takes a few seconds); tests that stop or kill
their server start their own (support.running)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exec_sandbox.images.catalog import MANIFEST_NAME
from exec_sandbox.paths import images_dir

from .support import Server, running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    manifest = images_dir() / MANIFEST_NAME
    assert manifest.is_file(), f"{manifest} missing: run `make images` before the VM tests"
    with running(tmp_path_factory.mktemp("serve")) as srv:
        yield srv
