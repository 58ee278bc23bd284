"""Package specifiers are checked before anything runs: only names and versions reach pip/npm."""

from __future__ import annotations

from pathlib import Path

import pytest

from exec_sandbox import PackageNotAllowedError, Scheduler, SchedulerConfig, VmConfigError
from exec_sandbox.packages.specs import PackageSpec, merge_packages, validate_packages

HOSTILE = [
    "six; rm -rf /",
    "--index-url=http://127.0.0.1:9/simple",
    "-r /etc/passwd",
    "x @ file:///etc/passwd",
    "x @ https://127.0.0.1/x.whl",
    "../x",
    "/etc/passwd",
    "git+https://127.0.0.1/x.git",
    "six==1.16.0 --hash=sha256:00",
    "six==1.16.0\n--extra-index-url=http://127.0.0.1",
    "six==1.16.0; python_version>'3'",
    "",
    "   ",
    "x" * 300,
    "s\u00efx==1.0",
]


@pytest.mark.parametrize("spec", HOSTILE)
@pytest.mark.parametrize("strict", [True, False])
def test_hostile_python_specifiers_are_refused(spec: str, strict: bool) -> None:
    with pytest.raises(PackageNotAllowedError):
        validate_packages([spec], "python", strict=strict)


@pytest.mark.parametrize(
    "spec",
    [
        "lodash@file:../x",
        "x@npm:lodash@4",
        "lodash@git+https://h/x",
        "lodash@https://127.0.0.1/x.tgz",
        "../x",
        "lodash@4.17.21 --registry=x",
        "Lodash@4.17.21",
        ".hidden@1.0.0",
        "lodash@#main",
        "--global",
        "-g",
        "-g@1.0.0",
        "--foreground-scripts@1.0.0",
        "--no-ignore-scripts",
        "@-x/y@1.0.0",
        "~x@1.0.0",
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_hostile_npm_specifiers_are_refused(spec: str, strict: bool) -> None:
    with pytest.raises(PackageNotAllowedError):
        validate_packages([spec], "javascript", strict=strict)


def test_pinned_python_specifiers_are_normalized() -> None:
    specs = validate_packages(
        ["Pandas==2.2.0", "requests[Socks, security]==2.31.0", "zope.interface==6.0"],
        "python",
        strict=True,
    )
    assert [s.requirement for s in specs] == [
        "pandas==2.2.0",
        "requests[socks,security]==2.31.0",
        "zope-interface==6.0",
    ]


def test_unpinned_python_needs_validation_off() -> None:
    for spec in ("numpy", "numpy>=1.26,<2", "numpy~=1.26"):
        with pytest.raises(PackageNotAllowedError, match="name==version"):
            validate_packages([spec], "python", strict=True)
    specs = validate_packages(["numpy >= 1.26, < 2", "six"], "python", strict=False)
    assert [s.requirement for s in specs] == ["numpy>=1.26,<2", "six"]


def test_npm_specifiers() -> None:
    assert validate_packages(
        ["lodash@4.17.21", "@types/node@18.0.0"], "javascript", strict=True
    ) == (PackageSpec("@types/node", "@types/node@18.0.0"), PackageSpec("lodash", "lodash@4.17.21"))
    with pytest.raises(PackageNotAllowedError, match="exact version"):
        validate_packages(["lodash@^4"], "javascript", strict=True)
    assert (
        validate_packages(["lodash@^4.17", "left-pad"], "javascript", strict=False)[1].requirement
        == "lodash@^4.17"
    )


def test_limits_and_shapes() -> None:
    with pytest.raises(PackageNotAllowedError, match="more than the limit of 50"):
        validate_packages([f"p{i}==1.0" for i in range(51)], "python", strict=True)
    assert len(validate_packages([f"p{i}==1.0" for i in range(50)], "python", strict=True)) == 50
    with pytest.raises(PackageNotAllowedError, match="named twice"):
        validate_packages(["six==1.16.0", "Six==1.15.0"], "python", strict=True)
    with pytest.raises(PackageNotAllowedError, match="list of strings"):
        validate_packages("six==1.16.0", "python", strict=True)
    with pytest.raises(PackageNotAllowedError, match="must be a string"):
        validate_packages([b"six==1.16.0"], "python", strict=True)
    with pytest.raises(PackageNotAllowedError, match="'raw' takes none"):
        validate_packages(["six==1.16.0"], "raw", strict=True)
    assert validate_packages(None, "raw", strict=True) == ()
    assert validate_packages([], "raw", strict=True) == ()


def test_a_call_overrides_the_default_version() -> None:
    defaults = validate_packages(["numpy==1.26.4", "six==1.16.0"], "python", strict=True)
    merged = merge_packages(defaults, validate_packages(["numpy==2.1.0"], "python", strict=True))
    assert [s.requirement for s in merged] == ["numpy==2.1.0", "six==1.16.0"]


def test_default_packages_are_checked_in_the_config() -> None:
    with pytest.raises(VmConfigError, match="default_packages"):
        SchedulerConfig(default_packages={"python": ["six; rm -rf /"]})
    with pytest.raises(VmConfigError, match="'raw'"):
        SchedulerConfig(default_packages={"raw": ["six==1.16.0"]})
    config = SchedulerConfig(default_packages={"python": ["six==1.16.0"]})
    assert config.default_packages == {"python": ("six==1.16.0",)}


@pytest.mark.parametrize("spec", HOSTILE[:6])
async def test_run_refuses_before_touching_a_vm(spec: str, tmp_path: Path) -> None:
    """No images exist under tmp_path: had the run got as far as starting anything, it would
    raise VmPermanentError instead."""
    scheduler = Scheduler(SchedulerConfig(images_dir=tmp_path))
    try:
        with pytest.raises(PackageNotAllowedError):
            await scheduler.run("print(1)", packages=[spec])
        with pytest.raises(PackageNotAllowedError):
            await scheduler.session(packages=[spec])
        with pytest.raises(PackageNotAllowedError, match="'raw' takes none"):
            await scheduler.run("echo 1", language="raw", packages=["six==1.16.0"])
    finally:
        await scheduler.close()
