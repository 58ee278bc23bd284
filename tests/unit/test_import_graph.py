"""The package's modules import one another without a cycle: every import counts, those under
`if TYPE_CHECKING:` and inside functions included (a cycle hidden behind a lazy import is still
two modules that cannot be understood one without the other). Read from the source files."""

from __future__ import annotations

import ast
from pathlib import Path

# The sources of this checkout (the installed copy may be older).
SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "exec_sandbox"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    # The C extension is known by its stub: a module that imports nothing of the package.
    extensions = {_module_name(p) for p in PACKAGE.rglob("*.pyi")} - set(modules)
    graph: dict[str, set[str]] = {name: set() for name in [*modules, *extensions]}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                # `from pkg import mod` imports the module mod (pkg is an ancestor, imported
                # first in any case); `from mod import name` the module mod.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in graph else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in graph:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    graph = _graph()
    assert len(graph) > 50, "the checker found too few modules: it is broken"
    assert _cycles(graph) == []


def test_checker_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
