"""The server's fan-out of process output (server/fanout.py), with a stand-in process whose
output is an in-memory async iterator (orchestration only; the real thing is in
tests/integration/server/test_streams.py): one reader per stream whatever the number of
clients, late clients replayed, a client that falls behind dropped alone, nothing kept once the
last client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from exec_sandbox.server import fanout
from exec_sandbox.server.fanout import Fanouts


class StandInProcess:
    def __init__(self, pid: int = 7) -> None:
        self.pid = pid
        self.readers = 0
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def _output(self) -> AsyncIterator[bytes]:
        self.readers += 1
        while (chunk := await self.chunks.get()) is not None:
            yield chunk

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        return self._output()

    stderr = stdout


async def _collect(subscriber: Any) -> bytes:
    return b"".join([chunk async for chunk in subscriber])


async def test_one_reader_serves_every_client_and_late_ones_get_the_replay() -> None:
    fanouts, process = Fanouts(), StandInProcess()
    with fanouts.attach("s", process, "stdout") as first:  # type: ignore[arg-type]
        with fanouts.attach("s", process, "stdout") as second:  # type: ignore[arg-type]
            await process.chunks.put(b"a")
            await asyncio.sleep(0)
            with fanouts.attach("s", process, "stdout") as late:  # type: ignore[arg-type]
                await process.chunks.put(b"b")
                await process.chunks.put(None)
                got = await asyncio.gather(_collect(first), _collect(second), _collect(late))
    assert list(got) == [b"ab", b"ab", b"ab"]
    assert process.readers == 1
    assert len(fanouts) == 0


async def test_a_client_too_far_behind_is_dropped_alone() -> None:
    fanouts, process = Fanouts(), StandInProcess()
    big = b"x" * (fanout.BEHIND_BYTES // 2 + 1)
    with fanouts.attach("s", process, "stdout") as slow:  # type: ignore[arg-type]
        with fanouts.attach("s", process, "stdout") as fast:  # type: ignore[arg-type]
            got: list[bytes] = []

            async def read_fast() -> None:
                async for chunk in fast:
                    got.append(chunk)

            reading = asyncio.ensure_future(read_fast())
            for n in range(1, 4):
                await process.chunks.put(big)
                while len(got) < n:  # the fast client keeps up; the slow one reads nothing
                    await asyncio.sleep(0)
            await process.chunks.put(None)
            await reading
            assert got == [big] * 3
        assert await _collect(slow) == big  # what was queued before it fell too far behind
        assert slow.too_slow


async def test_the_reader_stops_when_the_last_client_leaves() -> None:
    fanouts, process = Fanouts(), StandInProcess()
    with fanouts.attach("s", process, "stdout"):  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert len(fanouts) == 1
    assert len(fanouts) == 0
    with fanouts.attach("s", process, "stdout"):  # type: ignore[arg-type]
        await asyncio.sleep(0)
    assert process.readers == 2  # a new client after that starts a new reader
