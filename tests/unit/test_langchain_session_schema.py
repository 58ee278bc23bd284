"""What a model is shown of the LangChain session tool, without a VM: its language (the
arguments carry only code) and a refusal of arguments it does not take."""

from __future__ import annotations

import pydantic
import pytest

pytest.importorskip("langchain_core", reason="the langchain extra is not installed")

from exec_sandbox.integrations.langchain import ExecSandboxSessionTool


def test_the_description_names_the_sessions_language_and_packages() -> None:
    tool = ExecSandboxSessionTool(language="javascript", packages=["lodash@4.17.21"])
    try:
        assert "JavaScript" in tool.description and "lodash@4.17.21" in tool.description
        assert "Python" in ExecSandboxSessionTool().description
        assert ExecSandboxSessionTool(description="mine").description == "mine"
    finally:
        tool.close()


def test_a_language_argument_is_refused_not_ignored() -> None:
    tool = ExecSandboxSessionTool(language="javascript")
    try:
        with pytest.raises(pydantic.ValidationError, match="language"):
            tool.invoke({"code": "console.log(1)", "language": "python"})
    finally:
        tool.close()
