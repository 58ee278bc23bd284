"""`sbx doctor --cluster ADDRESS`: every host of a cluster, its checks (as `sbx doctor` on that
host) and its capacity. Exit 0 when every host can run code, 1 otherwise (or without hosts)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from ..errors import SandboxError


def doctor(address: str, as_json: bool) -> int:
    try:
        from ..cluster import ClusterScheduler

        async def collect() -> list[dict[str, Any]]:
            async with ClusterScheduler(address=address) as cluster:
                return await cluster.doctor()

        reports = asyncio.run(collect())
    except (SandboxError, ConnectionError) as exc:
        print(f"sbx: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(reports, indent=2, default=str))
    else:
        print(render(reports))
    return 0 if reports and all(r.get("healthy") for r in reports) else 1


def render(reports: list[dict[str, Any]]) -> str:
    if not reports:
        return "no sandbox host: no live node advertises the 'sandbox_host' resource"
    from .doctor import Check
    from .doctor import render as render_checks

    blocks = []
    for report in reports:
        info = report.get("info", {})
        head = f"== host {info.get('name', '?')}"
        if "error" in report:
            blocks.append(f"{head}: unreachable: {report['error']}")
            continue
        cap = info["capacity"]
        pool = ", ".join(f"{lang} {n}" for lang, n in cap["warm_pool"].items() if n) or "empty"
        head += (
            f" ({info['hostname']}, pid {info['pid']}, {info['accelerator']}): "
            f"{cap['vms_in_use']}/{cap['max_vms']} VMs in use, {cap['free_vms']} free, "
            f"{cap['waiting']} waiting, {cap['sessions']} sessions, warm pool {pool}"
        )
        checks = [Check(**c) for c in report["checks"]]
        blocks.append(head + "\n" + render_checks(checks))
    return "\n\n".join(blocks)
