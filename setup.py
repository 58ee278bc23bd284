"""Build of the C extension exec_sandbox._execsbx (everything else is in pyproject.toml)."""

from glob import glob

from setuptools import Extension, setup

# Warnings are errors, named one by one so that a new compiler does not silently add some.
WARNINGS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Werror=vla",
    "-Werror=implicit-fallthrough",
    "-Werror=strict-prototypes",
    "-Werror=missing-prototypes",
    "-Werror=shadow",
    "-Werror=format=2",
    "-Werror=implicit-function-declaration",
    "-Werror=incompatible-pointer-types",
]

setup(
    ext_modules=[
        Extension(
            "exec_sandbox._execsbx",
            sources=sorted(glob("src/_execsbx/*.c")) + ["src/shared/frame.c"],
            include_dirs=["src/shared", "src/_execsbx"],
            # A changed header rebuilds every source (setuptools otherwise compares .c files only).
            depends=sorted(glob("src/_execsbx/*.h") + glob("src/shared/*.h")),
            extra_compile_args=["-std=gnu11", "-fvisibility=hidden", *WARNINGS],
            libraries=["seccomp"],
        )
    ]
)
