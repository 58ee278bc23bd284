"""The Deep Agents backend against langchain's standard sandbox suite (langchain-tests), every
test in one real VM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("deepagents", reason="the deepagents extra is not installed")
pytest.importorskip("langchain_tests", reason="langchain-tests (integrations-test extra) is not installed")

from langchain_tests.integration_tests import SandboxIntegrationTests  # noqa: E402

from exec_sandbox.integrations.deepagents import ExecSandboxBackend  # noqa: E402

pytestmark = pytest.mark.vm


class TestExecSandboxBackendStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self) -> Iterator[ExecSandboxBackend]:
        backend = ExecSandboxBackend()
        try:
            yield backend
        finally:
            backend.close()
