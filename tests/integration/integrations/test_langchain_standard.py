"""The LangChain tools against langchain's standard tool suite (langchain-tests): ToolsUnitTests
(construction and the args schema) and ToolsIntegrationTests (invoke / ainvoke, with and without
a ToolCall, in real VMs). Plus what the suite does not pin: the args schema shows the model the
allowed languages, and a wrong one is refused by the framework's validation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
pytest.importorskip(
    "langchain_tests", reason="langchain-tests (integrations-test extra) is not installed"
)

from langchain_core.tools import BaseTool
from langchain_tests.integration_tests import ToolsIntegrationTests
from langchain_tests.unit_tests import ToolsUnitTests
from pydantic import ValidationError

from exec_sandbox.integrations.langchain import ExecSandboxSessionTool, ExecSandboxTool

pytestmark = pytest.mark.vm


class TestExecSandboxToolUnit(ToolsUnitTests):
    @property
    def tool_constructor(self) -> type[BaseTool]:
        return ExecSandboxTool

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"code": "print(6 * 7)", "language": "python"}


class TestExecSandboxToolIntegration(ToolsIntegrationTests):
    @property
    def tool_constructor(self) -> type[BaseTool]:
        return ExecSandboxTool

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"code": "print(6 * 7)", "language": "python"}


class _SessionToolFixture:
    """The session tool holds VMs until closed: each test's tool is closed after it."""

    @pytest.fixture
    def tool(self) -> Iterator[BaseTool]:
        tool = ExecSandboxSessionTool()
        try:
            yield tool
        finally:
            tool.close()


class TestExecSandboxSessionToolUnit(_SessionToolFixture, ToolsUnitTests):
    @property
    def tool_constructor(self) -> type[BaseTool]:
        return ExecSandboxSessionTool

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"code": "x = 6 * 7\nprint(x)"}


class TestExecSandboxSessionToolIntegration(_SessionToolFixture, ToolsIntegrationTests):
    @property
    def tool_constructor(self) -> type[BaseTool]:
        return ExecSandboxSessionTool

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"code": "x = 6 * 7\nprint(x)"}


def test_language_is_an_enum_in_the_schema_the_model_sees() -> None:
    tool = ExecSandboxTool()
    schema = tool.tool_call_schema.model_json_schema()  # type: ignore[union-attr]
    language = schema["properties"]["language"]
    assert language["enum"] == ["python", "javascript", "typescript", "ts", "raw"]
    assert language["default"] == "python"
    # The framework refuses a value outside the enum before the tool runs (no VM is started);
    # langgraph's ToolNode turns this into an error message listing the allowed values.
    with pytest.raises(
        ValidationError, match="'python', 'javascript', 'typescript', 'ts' or 'raw'"
    ):
        tool.invoke({"code": "print(1)", "language": "cobol"})
