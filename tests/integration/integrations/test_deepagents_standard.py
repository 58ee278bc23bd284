"""The Deep Agents backend against langchain's standard sandbox suite (langchain-tests), the whole
of it, in one real VM.

deepagents 0.7's BaseSandbox disagrees with the suite on glob (absolute paths, files only) and
write (overwrites); ExecSandboxBackend's default `file_contract="standard"` follows the suite,
see test_deepagents.py for what that means inside an agent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("deepagents", reason="the deepagents extra is not installed")
pytest.importorskip(
    "langchain_tests", reason="langchain-tests (integrations-test extra) is not installed"
)

from langchain_tests.integration_tests import SandboxIntegrationTests

from exec_sandbox.integrations.deepagents import ExecSandboxBackend

from .conftest import assert_no_vm_left

pytestmark = [pytest.mark.vm, pytest.mark.filterwarnings("ignore::pytest.PytestRemovedIn10Warning")]


class TestExecSandboxBackendStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self) -> Iterator[ExecSandboxBackend]:
        backend = ExecSandboxBackend()
        try:
            yield backend
        finally:
            backend.close()
            assert_no_vm_left()
