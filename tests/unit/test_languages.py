"""Language names without a VM: TypeScript's names run in the javascript runtime everywhere a
language is taken (run()/session() options, the CLI, the integrations), and the image's facts
decide whether node gets a user-land startup blob."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from exec_sandbox import CodeValidationError, RunRequest, SchedulerConfig
from exec_sandbox.cli.arguments import resolve_source
from exec_sandbox.images.catalog import GuestFacts, GuestImages, load_images
from exec_sandbox.integrations._code_mode import binding_code, offered
from exec_sandbox.integrations._common import LANGUAGES, runtime_language
from exec_sandbox.snapshots import l1, node_startup
from exec_sandbox.validation import validate_language
from exec_sandbox.vm import host_facts
from exec_sandbox.vm.spec import VmSpec


@pytest.mark.parametrize(
    ("name", "runtime"),
    [
        ("typescript", "javascript"),
        ("ts", "javascript"),
        ("javascript", "javascript"),
        ("python", "python"),
        ("raw", "raw"),
    ],
)
def test_typescript_names_validate_to_the_javascript_runtime(name: str, runtime: str) -> None:
    assert validate_language(name) == runtime
    request = RunRequest.make({"language": name}, SchedulerConfig(), code="1")  # type: ignore[typeddict-item]
    assert request.language == runtime


def test_an_unknown_language_lists_the_names_it_takes() -> None:
    with pytest.raises(CodeValidationError, match="typescript, ts"):
        validate_language("ruby")
    with pytest.raises(CodeValidationError):
        validate_language("TypeScript")  # names are exact, as the other languages'


@pytest.mark.parametrize("suffix", [".ts", ".mts", ".cts", ".js", ".mjs", ".cjs"])
def test_the_cli_runs_typescript_and_javascript_files_as_javascript(
    tmp_path: Path, suffix: str
) -> None:
    script = tmp_path / f"app{suffix}"
    script.write_text("const n: number = 1;\n")
    args = argparse.Namespace(code=None, file=str(script), language=None)
    assert resolve_source(args) == ("const n: number = 1;\n", "javascript")
    flagged = argparse.Namespace(code="let a: string", file=None, language="ts")
    assert resolve_source(flagged) == ("let a: string", "javascript")


def test_integrations_offer_typescript_and_share_javascripts_session_and_tools() -> None:
    assert {"typescript", "ts"} <= set(LANGUAGES)
    assert runtime_language("typescript") == runtime_language("ts") == "javascript"
    assert binding_code("typescript", ["search"]) == binding_code("javascript", ["search"])
    assert binding_code("typescript", ["search"]) is not None
    tools = {"search": lambda q: q}
    assert offered("ts", tools) == tools  # type: ignore[arg-type]


def test_the_langchain_schema_lists_typescript() -> None:
    pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
    from exec_sandbox.integrations.langchain import ExecSandboxInput, ExecSandboxSessionTool

    schema = ExecSandboxInput.model_json_schema()
    assert {"typescript", "ts"} <= set(schema["properties"]["language"]["enum"])
    tool = ExecSandboxSessionTool(language="typescript")
    try:
        assert "TypeScript" in tool.description
    finally:
        tool.close()


def _spec(facts: GuestFacts | None) -> VmSpec:
    images = GuestImages(Path("/k"), Path("/r"), kernel_hash="k1", rootfs_hash="r1", guest=facts)
    return VmSpec(qemu_binary=host_facts.qemu_binary(), images=images, accel="tcg", memory_mb=192)


def test_a_node_with_its_own_startup_snapshot_gets_no_blob() -> None:
    debian = GuestFacts(python="3.11", glibc="2.36", tree="ab", node="18.20.4")
    official = replace(debian, node="22.20.0", node_snapshot=True)
    assert node_startup.wanted(_spec(None)) and node_startup.wanted(_spec(debian))
    assert not node_startup.wanted(_spec(official))
    assert l1._gets_node_blob(_spec(debian), "javascript")
    assert not l1._gets_node_blob(_spec(official), "javascript")
    # The snapshot key says which: a template of one is never taken for the other's.
    assert l1.snapshot_key(_spec(debian), "javascript") != l1.snapshot_key(
        _spec(official), "javascript"
    )


def test_the_manifest_carries_nodes_facts(tmp_path: Path) -> None:
    for name in ("k", "r"):
        (tmp_path / name).write_bytes(b"x")
    guest = {
        "python": "3.13",
        "glibc": "2.41",
        "tree": "ab12",
        "node": "22.20.0",
        "node_snapshot": True,
    }
    manifest = {
        "kernel": str(tmp_path / "k"),
        "rootfs": str(tmp_path / "r"),
        "kernel_hash": "k1",
        "rootfs_hash": "r1",
        "guest": guest,
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    facts = load_images(tmp_path).guest
    assert facts == GuestFacts("3.13", "2.41", "ab12", node="22.20.0", node_snapshot=True)
    # What the guest wrote is checked: a bad version is dropped, a non-boolean is False.
    manifest["guest"] = {**guest, "node": "22; rm -rf /", "node_snapshot": "yes"}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    facts = load_images(tmp_path).guest
    assert facts is not None and (facts.node, facts.node_snapshot) == ("", False)


def test_layer_bytecode_comes_from_the_images_own_python_when_the_host_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exec_sandbox.packages.pip_layer import bytecode_python
    from exec_sandbox.packages.target import GuestTarget

    # A version manager's shim on PATH that does not start is not taken.
    shim = tmp_path / "bin" / "python3.99"
    shim.parent.mkdir()
    shim.write_text("#!/bin/sh\nexit 127\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", str(shim.parent))
    assert bytecode_python(GuestTarget("3.99", "2.41", "ab")) is None
    tree = tmp_path / "rootfs-tree-ab"
    for part in ("lib64/ld-linux-x86-64.so.2", "usr/bin/python3.99"):
        (tree / part).parent.mkdir(parents=True, exist_ok=True)
        (tree / part).write_bytes(b"")
    found = bytecode_python(GuestTarget("3.99", "2.41", "ab", tree_root=tree))
    assert found is not None
    assert found.argv[0] == str(tree / "lib64/ld-linux-x86-64.so.2")
    assert found.argv[-1] == str(tree / "usr/bin/python3.99")
    assert found.workers == "1"  # compileall's workers could not start that interpreter
