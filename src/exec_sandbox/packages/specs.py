"""What a caller may ask for in `packages=`: checked before anything runs.

A specifier reaches pip or npm on the host as a requirement, so everything that is not a plain
name and version is refused: URLs, paths, `name @ url` references, environment markers
(`six; rm -rf /` would be a marker), options (`--index-url=...`), npm aliases, git and tarball
specs. With `enable_package_validation` (the default) only exact pins are taken:
`name[extras]==version` for Python, `name@version` for npm. Without it, plain version ranges are
accepted too (`numpy>=1.26,<2`, `lodash@^4`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import PackageNotAllowedError
from ..models import Language

MAX_PACKAGES = 50
SPEC_MAX_CHARS = 256

# Python: PEP 508 names, PEP 440 public versions (with an optional local part).
_PY_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PY_EXTRAS = rf"\[\s*{_PY_NAME}(?:\s*,\s*{_PY_NAME})*\s*\]"
_PY_VERSION = (
    r"(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?"
)
_PY_PINNED = re.compile(
    rf"(?P<name>{_PY_NAME})(?P<extras>{_PY_EXTRAS})?==(?P<version>{_PY_VERSION})", re.IGNORECASE
)
_PY_CLAUSE = r"(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_PY_RANGE = re.compile(
    rf"(?P<name>{_PY_NAME})\s*(?P<extras>{_PY_EXTRAS})?\s*(?P<spec>{_PY_CLAUSE}(?:\s*,\s*{_PY_CLAUSE})*)?"
)
# npm: lower-case names, optionally scoped; exact semver versions; ranges of the semver grammar
# (no ':' '/' '#': those start aliases, URLs, git and file specs).
# A name and a scope start with a letter or digit: a leading "-" would make it an npm option.
_NPM_NAME = r"(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*"
_SEMVER = (
    r"[0-9]+\.[0-9]+\.[0-9]+"
    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"  # pre-release
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"  # build metadata
)
_NPM_PINNED = re.compile(rf"(?P<name>{_NPM_NAME})@(?P<version>{_SEMVER})")
_NPM_RANGE = re.compile(rf"(?P<name>{_NPM_NAME})(?:@(?P<range>[0-9A-Za-z.^~<>=| *+-]+))?")
_NPM_NAME_MAX = 214
# A bare name (installs from inside a session: `pip install six` takes the newest version, which
# the host records exactly).
_PY_BARE = re.compile(rf"(?P<name>{_PY_NAME})\s*(?P<extras>{_PY_EXTRAS})?", re.IGNORECASE)
_NPM_BARE = re.compile(rf"(?P<name>{_NPM_NAME})")


@dataclass(frozen=True, order=True)
class PackageSpec:
    """One requested package: its normalized name (what identifies it in a set) and the
    requirement text handed to pip or npm."""

    name: str
    requirement: str


def validate_packages(
    packages: object, language: Language, *, strict: bool, bare: bool = False
) -> tuple[PackageSpec, ...]:
    """The packages of one call, checked and sorted; () for None or an empty list. Raises
    PackageNotAllowedError naming the first bad entry. bare: names without a version are taken
    too (what `pip install six` inside a session asks for)."""
    if packages is None:
        return ()
    if isinstance(packages, (str, bytes)) or not isinstance(packages, Sequence):
        raise PackageNotAllowedError(
            f"packages must be a list of strings, got {type(packages).__name__}"
        )
    if not packages:
        return ()
    if language == "raw":
        raise PackageNotAllowedError(
            "packages are installed for python and javascript; language 'raw' takes none"
        )
    if len(packages) > MAX_PACKAGES:
        raise PackageNotAllowedError(
            f"{len(packages)} packages, more than the limit of {MAX_PACKAGES}"
        )
    specs: dict[str, PackageSpec] = {}
    for entry in packages:
        spec = _parse(entry, language, strict, bare)
        if spec.name in specs:
            raise PackageNotAllowedError(f"package {spec.name!r} is named twice")
        specs[spec.name] = spec
    return tuple(sorted(specs.values()))


def merge_packages(
    defaults: Iterable[PackageSpec], requested: Iterable[PackageSpec]
) -> tuple[PackageSpec, ...]:
    """A scheduler's default set with a call's packages on top: a package named by the call
    replaces the default's version of it."""
    merged = {spec.name: spec for spec in defaults}
    merged.update((spec.name, spec) for spec in requested)
    return tuple(sorted(merged.values()))


def _parse(entry: object, language: Language, strict: bool, bare: bool = False) -> PackageSpec:
    if not isinstance(entry, str):
        raise PackageNotAllowedError(f"a package must be a string, got {type(entry).__name__}")
    text = entry.strip()
    if not text or len(text) > SPEC_MAX_CHARS or not text.isascii() or not text.isprintable():
        raise PackageNotAllowedError(f"package specifier {entry[:64]!r} is not acceptable")
    if language == "python":
        return _parse_python(entry, text, strict, bare)
    return _parse_npm(entry, text, strict, bare)


def _parse_python(entry: str, text: str, strict: bool, bare: bool) -> PackageSpec:
    match = _PY_PINNED.fullmatch(text)
    if match is None and not strict:
        match = _PY_RANGE.fullmatch(text)
    if match is None and bare:
        match = _PY_BARE.fullmatch(text)
    if match is None:
        form = (
            "name==version or name[extra]==version"
            if strict
            else "a name with an optional version range"
        )
        raise PackageNotAllowedError(
            f"package {entry!r} is not allowed: expected {form} "
            "(no URLs, paths, markers or options)"
        )
    name = re.sub(r"[-_.]+", "-", match["name"]).lower()
    extras = match["extras"]
    extras = (
        "[" + ",".join(e.strip().lower() for e in extras[1:-1].split(",")) + "]" if extras else ""
    )
    groups = match.groupdict()
    if groups.get("version") is not None:
        constraint = "==" + groups["version"]
    else:
        constraint = re.sub(r"\s+", "", groups.get("spec") or "")
    return PackageSpec(name, f"{name}{extras}{constraint}")


def _parse_npm(entry: str, text: str, strict: bool, bare: bool) -> PackageSpec:
    match = _NPM_PINNED.fullmatch(text)
    if match is None and bare:
        match = _NPM_BARE.fullmatch(text)
    if match is None and not strict:
        match = _NPM_RANGE.fullmatch(text)
        # "-" alone joins a hyphen range ("1.0.0 - 2.0.0"); a word starting with it is an option.
        if match is not None and any(
            w.startswith("-") and w != "-" for w in (match["range"] or "").split()
        ):
            match = None
    if match is None or len(match["name"]) > _NPM_NAME_MAX:
        form = (
            "name@version (an exact version)" if strict else "a name with an optional version range"
        )
        raise PackageNotAllowedError(
            f"package {entry!r} is not allowed: expected {form} (no URLs, paths, git or aliases)"
        )
    groups = match.groupdict()
    version = groups.get("version") or (groups.get("range") or "").strip()
    return PackageSpec(match["name"], f"{match['name']}@{version}" if version else match["name"])
