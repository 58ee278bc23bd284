"""The guest's pip (guest/runtime/python/exec_sandbox_guest/_install.py) and the REPL driver's
notebook lines (guest/repl/driver.py), run on the host's python: what a command line asks the
host for, what is refused before anything is sent, and how a `%pip` cell is rewritten."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

GUEST = Path(__file__).resolve().parents[2] / "guest"


@pytest.fixture
def pip_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(GUEST / "runtime" / "python"))
    for name in [n for n in sys.modules if n.startswith("exec_sandbox_guest")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("exec_sandbox_guest._install")


def _driver() -> dict[str, object]:
    source = (GUEST / "repl" / "driver.py").read_text().replace("\n_main()\n", "\n")
    namespace: dict[str, object] = {}
    exec(compile(source, "driver.py", "exec"), namespace)
    return namespace


def test_install_arguments_become_requirement_texts(pip_module: ModuleType) -> None:
    texts, upgrade = pip_module.parse_install(
        ["-q", "--upgrade", "six==1.16.0", "requests[socks]", "--progress-bar", "off", "--user"]
    )
    assert texts == ["six==1.16.0", "requests[socks]"]
    assert upgrade is True


def test_a_requirements_file_is_read(pip_module: ModuleType, tmp_path: Path) -> None:
    req = tmp_path / "req.txt"
    req.write_text("# comment\nsix==1.16.0  # pinned\n\nsbxdemo\n")
    assert pip_module.parse_install(["-r", str(req)])[0] == ["six==1.16.0", "sbxdemo"]


@pytest.mark.parametrize(
    "args",
    [
        ["-i", "http://elsewhere/simple", "six"],
        ["--index-url=http://elsewhere/simple", "six"],
        ["--extra-index-url", "http://elsewhere", "six"],
        ["./six-1.16.0-py3-none-any.whl"],
        ["git+https://example.invalid/six"],
        ["-e", "."],
        [],
    ],
)
def test_other_sources_are_refused_before_the_host_is_asked(
    pip_module: ModuleType, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert pip_module.main(["install", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ")


def test_uninstall_and_unknown_commands_fail_like_pip(
    pip_module: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pip_module.main(["uninstall", "six"]) == 1
    assert pip_module.main(["frobnicate"]) == 1
    assert 'ERROR: unknown command "frobnicate"' in capsys.readouterr().err


def test_pip_lines_of_a_cell_that_is_not_python_are_rewritten_line_for_line() -> None:
    shell_lines = _driver()["_shell_lines"]
    cell = b"x = 1\n%pip install six==1.16.0\nif x:\n  !ls -l /tmp\nimport six\n"
    rewritten = shell_lines(cell)  # type: ignore[operator]
    lines = rewritten.decode().splitlines()
    assert len(lines) == 5
    assert lines[1] == (
        '__import__("exec_sandbox_guest._install", fromlist=["magic"]).magic('
        "'install six==1.16.0')"
    )
    assert lines[3] == "  __import__(\"subprocess\").run('ls -l /tmp', shell=True)"
    compile(rewritten, "cell", "exec")
    assert shell_lines(b"x = (\n") is None  # type: ignore[operator]


@pytest.fixture
def npm_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(GUEST / "runtime" / "python"))
    for name in [n for n in sys.modules if n.startswith("exec_sandbox_guest")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("exec_sandbox_guest._npm")


def test_npm_install_arguments(npm_module: ModuleType) -> None:
    specs = npm_module.parse_install(["sbxjs@1.0.0", "--save", "@scope/x@^1", "left-pad", "-D"])
    assert specs == ["sbxjs@1.0.0", "@scope/x@^1", "left-pad"]


@pytest.mark.parametrize(
    "args",
    [
        ["git+https://example.invalid/x.git"],
        ["./local-dir"],
        ["user/repo"],
        ["@scope/name/extra"],
        ["--registry=http://elsewhere", "x"],
        ["file:../x"],
        [],
    ],
)
def test_npm_sources_other_than_the_registry_are_refused(
    npm_module: ModuleType, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert npm_module.main(["install", *args]) == 1
    assert capsys.readouterr().err.startswith("npm error")
