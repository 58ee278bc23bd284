"""The root image's python bytecode is valid in every VM: hash-based .pyc files that are never
checked against their source. The image is packed with zeroed timestamps, so the timestamp
.pyc files Debian's install writes would be stale and recompiled at every import."""

from __future__ import annotations

import pytest

from exec_sandbox import Scheduler

pytestmark = pytest.mark.vm

CHECK = r"""
import sys, importlib.util
import json, asyncio, email.message, http.client, csv, decimal, sqlite3  # a broad sample
stale = []
checked = 0
for name, module in sorted(sys.modules.items()):
    source = getattr(module, "__file__", None) or ""
    if not source.endswith(".py") or source.startswith("/run/"):
        continue
    try:
        header = open(importlib.util.cache_from_source(source), "rb").read(16)
    except OSError:
        stale.append(name + " (no .pyc)")
        continue
    checked += 1
    if header[:4] != importlib.util.MAGIC_NUMBER or int.from_bytes(header[4:8], "little") != 1:
        stale.append(name)
print(checked > 100, stale)
"""


async def test_stdlib_bytecode_is_hash_based_and_unchecked(scheduler: Scheduler) -> None:
    result = await scheduler.run(CHECK)
    assert result.stdout == "True []\n", result.stdout + result.stderr
