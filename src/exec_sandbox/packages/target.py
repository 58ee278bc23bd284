"""The guest a layer is built for: its interpreter version and C library, as the root image's
build recorded them (images.GuestFacts). Everything a host-side build must match lives here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import VmPermanentError
from ..images.catalog import GuestImages

# The sandbox is an x86_64 QEMU guest on every host.
GUEST_ARCH = "x86_64"
# The oldest manylinux tag (manylinux1 = glibc 2.5); every later one up to the guest's glibc is
# acceptable too.
_MANYLINUX_OLDEST_MINOR = 5
_LEGACY_MANYLINUX = ("manylinux2014", "manylinux2010", "manylinux1")


@dataclass(frozen=True)
class GuestTarget:
    python: str  # "3.11"
    glibc: str  # "2.36"
    tree: str  # hash of the image's Debian package tree
    # The image's unpacked package tree beside its image (images/build-rootfs.sh), if still in
    # the images directory: its python compiles a layer's bytecode when the host has none of the
    # guest's version. Not part of any key: the tree hash is.
    tree_root: Path | None = field(default=None, compare=False)

    @classmethod
    def of(cls, images: GuestImages) -> GuestTarget:
        if images.guest is None:
            raise VmPermanentError(
                "the guest images predate package support (no python/glibc facts in their "
                "manifest): rebuild them with `sbx setup`"
            )
        root = images.rootfs.parent / f"rootfs-tree-{images.guest.tree}"
        return cls(
            images.guest.python,
            images.guest.glibc,
            images.guest.tree,
            tree_root=root if root.is_dir() else None,
        )

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def site_packages(self) -> str:
        """Where the guest's python finds the layer (a link in the image to its mount point)."""
        return f"/usr/local/lib/python{self.python}/dist-packages"

    def platforms(self) -> list[str]:
        """Every platform tag the guest's glibc accepts. pip takes a `manylinux_2_36` tag as
        that tag alone, not as "2.36 or older", so the whole range is listed."""
        major, minor = (int(part) for part in self.glibc.split(".")[:2])
        if major != 2:
            raise VmPermanentError(f"unexpected guest glibc version {self.glibc}")
        tags = [
            f"manylinux_2_{m}_{GUEST_ARCH}" for m in range(minor, _MANYLINUX_OLDEST_MINOR - 1, -1)
        ]
        if minor >= 17:
            tags += [f"{legacy}_{GUEST_ARCH}" for legacy in _LEGACY_MANYLINUX]
        return tags

    def pip_target_options(self) -> list[str]:
        """pip options that make it pick wheels for the guest instead of the host."""
        options = [
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            self.python,
            "--abi",
            self.python_tag,
        ]
        for platform in self.platforms():
            options += ["--platform", platform]
        return options
