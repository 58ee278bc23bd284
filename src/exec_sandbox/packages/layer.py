"""A package layer as a VM sees it: one read-only disk image of a language's packages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..models import PackagesReport


@dataclass(frozen=True)
class PackageLayer:
    key: str  # content key: the lock, the guest image's package tree, the target, the format
    path: Path  # the EROFS image (published, never rewritten)
    kind: str  # "python" or "javascript": where the guest mounts it
    report: PackagesReport  # what getting it cost the call that asked for it

    @property
    def identity(self) -> str:
        """What makes VMs with this layer differ from others (snapshot keys, pool matching)."""
        return f"{self.kind}:{self.key}"
