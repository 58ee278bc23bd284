"""Build of the C extension exec_sandbox._execsbx, and of the image recipe the package carries
(everything else is in pyproject.toml)."""

import os
import shutil
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


def shared_warnings(path: str = "src/shared/warnings.mk") -> list[str]:
    """SBX_WARNINGS of the warning list all three C builds read (a make assignment)."""
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        name, sep, value = line.partition(":=")
        if sep and name.strip() == "SBX_WARNINGS":
            return value.split()
    raise SystemExit(f"{path}: no SBX_WARNINGS")


# What `sbx setup` builds the guest images from, copied into the package as exec_sandbox/_recipe/
# with this repository's layout, so that images/build.sh runs the same from either place (one
# recipe: `make images` runs `sbx setup` too). The guest agent travels as its C sources and is
# compiled by the build, like the kernel. MANIFEST.in puts the same files in the sdist.
RECIPE = [
    "images/build.sh",
    "images/build-kernel.sh",
    "images/build-rootfs.sh",
    "images/lib.sh",
    "images/kernel/compile.sh",
    "images/kernel/sandbox.config",
    "images/kernel/patches/*.patch",
    "images/rootfs/packages.txt",
    "images/rootfs/make-tree.sh",
    "images/rootfs/pinned-wheels.txt",
    "images/rootfs/install-wheels.sh",
    "images/rootfs/finish-image.sh",
    "guest/Makefile",
    "guest/src/*.[ch]",
    "guest/node/*.c",
    "guest/repl/driver.py",
    "guest/repl/driver.js",
    "guest/repl/driver.sh",
    "guest/repl/prestart.js",
    "guest/template/build.sh",
    "guest/runtime/node/tools.js",
    "guest/runtime/node/tools_global.js",
    "guest/runtime/node/ts_hook.js",
    "guest/runtime/python/exec_sandbox_guest.pth",
    "guest/runtime/python/exec_sandbox_guest/*.py",
    "src/shared/*.[ch]",
    "src/shared/warnings.mk",
]


def recipe_files() -> list[str]:
    files = []
    for pattern in RECIPE:
        found = sorted(glob(pattern))
        if not found:
            raise SystemExit(f"image recipe file missing: {pattern}")
        files += found
    return files


class BuildPyWithRecipe(build_py):
    def run(self) -> None:
        super().run()
        target = os.path.join(self.build_lib, "exec_sandbox", "_recipe")
        shutil.rmtree(target, ignore_errors=True)
        for path in recipe_files():
            dest = os.path.join(target, path)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(path, dest)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        target = os.path.join(self.build_lib, "exec_sandbox", "_recipe")
        recipe = [os.path.join(target, p) for p in recipe_files()]
        return [*super().get_outputs(include_bytecode), *recipe]


setup(
    cmdclass={"build_py": BuildPyWithRecipe},
    ext_modules=[
        Extension(
            "exec_sandbox._execsbx",
            sources=sorted(glob("src/_execsbx/*.c")) + ["src/shared/frame.c"],
            include_dirs=["src/shared", "src/_execsbx"],
            # A changed header rebuilds every source (setuptools otherwise compares .c files only).
            depends=sorted(glob("src/_execsbx/*.h") + glob("src/shared/*.h"))
            + ["src/shared/warnings.mk"],
            extra_compile_args=["-std=gnu11", "-fvisibility=hidden", *shared_warnings()],
            # liburing drives the network relay (net_relay.c); without liburing-dev the build
            # stops at `#include <liburing.h>` (scripts/install-system-deps.sh installs it).
            libraries=["seccomp", "uring"],
        )
    ],
)
