"""JavaScript package trees, built on the host with the host's npm.

`--ignore-scripts` everywhere: no install script of any package runs on the host (packages that
need one to build a native addon do not work in the sandbox). The host's npm configuration
(registry, scoped registries, auth tokens in ~/.npmrc, proxy, CA) applies as it is, so tokens
never reach a VM. The tree becomes the guest's /node_modules, where require() and import both
end their search.

Steps: resolve (`npm install --package-lock-only`: a lock file, nothing fetched but package
documents), download (`npm ci` from that lock: tarballs checked against their integrity hashes,
unpacked).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import PackageBuildError, PackageNotAllowedError
from .specs import PackageSpec
from .tools import ToolRefused, ToolResult, redact_urls, require_tool, run_tool, tool_env

RESOLVE_TIMEOUT_SECONDS = 300.0
DOWNLOAD_TIMEOUT_SECONDS = 900.0
_NPM_FLAGS = (
    "--ignore-scripts",
    "--no-audit",
    "--no-fund",
    "--no-update-notifier",
    "--loglevel=error",
)
_NETWORK_TROUBLE = re.compile(r"ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENETUNREACH")
_TARBALL_URL = re.compile(r"https?://[^\s#]+\.tgz")
# npm must never run git on the host (a git dependency's prepare script would run with it).
_NPM_ENV = {"npm_config_git": "/bin/false"}
_MANIFEST = {"name": "sbx-package-layer", "version": "1.0.0", "private": True}


def npm() -> str:
    return require_tool("npm", "npm")


async def resolve(specs: tuple[PackageSpec, ...], work: Path) -> dict[str, Any]:
    """Resolve the requirements to a lock: {"manifest": package.json, "lock": package-lock.json}."""
    project = work / "resolve"
    project.mkdir(parents=True)
    (project / "package.json").write_text(json.dumps(_MANIFEST))
    result = await run_tool(
        [
            npm(),
            "install",
            "--package-lock-only",
            "--save-exact",
            *_NPM_FLAGS,
            "--cache",
            str(work / "npm-cache"),
            "--",
            *(spec.requirement for spec in specs),
        ],
        timeout=RESOLVE_TIMEOUT_SECONDS,
        what="resolving the packages with npm",
        cwd=project,
        env=tool_env(_NPM_ENV),
    )
    if result.returncode != 0:
        raise _npm_failure(result)
    try:
        return {
            "manifest": json.loads((project / "package.json").read_text()),
            "lock": json.loads((project / "package-lock.json").read_text()),
        }
    except (OSError, ValueError) as exc:
        raise PackageBuildError(f"npm left no usable lock file: {exc}") from None


def locked_packages(resolution: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, version, integrity) of every package the lock installs, sorted. Only registry
    tarballs with an integrity hash are taken: a git, file or link dependency (which npm
    would fetch or build by running a program on the host) is refused."""
    try:
        entries = resolution["lock"]["packages"]
        out = []
        for path, entry in entries.items():
            if not path:
                continue  # the project itself
            name = path.rsplit("node_modules/", 1)[-1]
            resolved, integrity = str(entry.get("resolved", "")), str(entry.get("integrity", ""))
            if entry.get("link") or not _TARBALL_URL.fullmatch(resolved) or not integrity:
                raise PackageNotAllowedError(
                    f"{name} resolves to {resolved or 'a non-registry source'}: only registry "
                    "tarballs with an integrity hash are installed (no git, file or link sources)"
                )
            out.append((name, str(entry["version"]), integrity))
        return sorted(out)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PackageBuildError(f"npm's lock file is not in a known format: {exc}") from None


async def download(resolution: dict[str, Any], work: Path) -> Path:
    """Fetch and unpack the locked packages; returns the node_modules directory."""
    project = work / "install"
    project.mkdir(parents=True)
    (project / "package.json").write_text(json.dumps(resolution["manifest"]))
    (project / "package-lock.json").write_text(json.dumps(resolution["lock"]))
    result = await run_tool(
        [npm(), "ci", *_NPM_FLAGS, "--cache", str(work / "npm-cache")],
        timeout=DOWNLOAD_TIMEOUT_SECONDS,
        what="downloading the packages with npm",
        cwd=project,
        env=tool_env(_NPM_ENV),
    )
    if result.returncode != 0:
        raise _npm_failure(result)
    modules = project / "node_modules"
    if not modules.is_dir():
        modules.mkdir()
    return modules


def _npm_failure(result: ToolResult) -> Exception:
    text = result.stderr + result.stdout
    if _NETWORK_TROUBLE.search(text):
        return PackageBuildError(f"the npm registry could not be reached: {result.tail()}")
    # npm's own error lines ("npm error ..." or the older "npm ERR! ..."), for the VM's npm.
    lines = [
        redact_urls(line)
        for line in text.splitlines()
        if line.startswith(("npm error", "npm ERR!")) and "A complete log" not in line
    ][:20]
    if re.search(r"\bE404\b|\bETARGET\b|No matching version|is not in this registry", text):
        return ToolRefused(
            f"a requested package or version does not exist on the npm registry: {result.tail()}",
            lines,
        )
    if "ERESOLVE" in text:
        return ToolRefused(f"the requested packages conflict: {result.tail()}", lines)
    return PackageBuildError(f"npm failed: {result.tail()}")
