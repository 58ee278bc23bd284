"""The C extension has one importer: `vm/binding.py` (docs/architecture.md). Every other module of
the package reaches the C core through it, so that the extension's surface the package depends
on is the one `vm/binding.py` shows. Read from the source files, no VM."""

from __future__ import annotations

import ast
from pathlib import Path

# The sources of this checkout (the installed copy may be older).
PACKAGE = Path(__file__).resolve().parents[2] / "src" / "exec_sandbox"


def _imports_extension(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(alias.name.endswith("_execsbx") for alias in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.endswith("_execsbx") or (
                module in ("", "exec_sandbox") and any(a.name == "_execsbx" for a in node.names)
            ):
                lines.append(node.lineno)
    return lines


def test_only_vm_module_imports_the_extension() -> None:
    importers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = _imports_extension(ast.parse(path.read_text(), str(path)))
        if lines:
            importers[str(path.relative_to(PACKAGE))] = lines
    assert importers == {"vm/binding.py": importers.get("vm/binding.py")}
    assert importers.get("vm/binding.py"), "the checker found no import at all: it is broken"
