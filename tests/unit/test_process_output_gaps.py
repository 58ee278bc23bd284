"""ProcessOutput's arithmetic over the offsets the guest answers (processes.py): gaps and the
dropped counts; and the handles' repr. Without a VM: a stand-in host answers each PROC_READ
from a script, as the C decoder would type the events; says nothing about a real guest
(functional/test_processes.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exec_sandbox import _execsbx
from exec_sandbox.processes import OutputGap, Process, Terminal

EOF_FLAG = 1


class ScriptedHost:
    """Answers the reads in order with (offset, data, eof); records the offsets asked for."""

    def __init__(self, answers: list[tuple[int, bytes, bool]]) -> None:
        self.answers = answers
        self.asked: list[int] = []

    async def _process_request(
        self,
        send: Callable[[Any, int, int], int],
        expect: str,
        *,
        held: bool,
        hold_ms: int = 0,
        timeout: float | None = 30.0,
    ) -> Any:
        asked: list[int] = []

        class Vm:
            def send_proc_read(self, i: int, pid: int, code: int, offset: int, *rest: int) -> int:
                asked.append(offset)
                return 0

        send(Vm(), 1, hold_ms)
        self.asked += asked
        offset, data, eof = self.answers.pop(0)
        return _execsbx.ProcDataEvent(("proc_data", 1, offset, EOF_FLAG if eof else 0, data))


async def test_dropped_counts_the_missing_bytes_not_the_offset_reached() -> None:
    # 100 bytes read, then the ring had moved on: the next answer starts at 1000.
    host = ScriptedHost([(0, b"a" * 100, False), (1000, b"b" * 10, False), (1010, b"", True)])
    process = Process(host, 42, "server", False)
    chunks = [chunk async for chunk in process.stdout]
    assert host.asked == [0, 100, 1010]
    assert chunks[0] == b"a" * 100
    assert isinstance(chunks[1], OutputGap) and chunks[1].dropped == 900
    assert chunks[2:] == [b"b" * 10]
    assert process.stdout_dropped == 900


async def test_dropped_adds_up_one_readers_gaps_and_keeps_the_largest_reader() -> None:
    host = ScriptedHost(
        [(0, b"x" * 5, False), (50, b"y" * 5, False), (100, b"z", True)] + [(80, b"w" * 21, True)]
    )
    process = Process(host, 42, "server", False)
    first = [chunk async for chunk in process.stdout]
    gaps = [c.dropped for c in first if isinstance(c, OutputGap)]
    assert gaps == [45, 45]
    assert process.stdout_dropped == 90  # 5 of the first 100 bytes and 5 more were read
    # A second reader that missed 80 bytes leaves the most any one reader missed at 90.
    second = [chunk async for chunk in process.stdout]
    assert isinstance(second[0], OutputGap) and second[0].dropped == 80
    assert process.stdout_dropped == 90
    assert process.stderr_dropped == 0


def test_a_terminal_says_it_is_one_in_its_repr() -> None:
    # session.processes() lists both kinds; a listing of "<Process ...>" hid the terminals.
    host = ScriptedHost([])
    assert repr(Process(host, 7, "sleep 9", False)) == "<Process pid=7 'sleep 9' running>"
    assert repr(Terminal(host, 8, "bash", 80, 24)) == "<Terminal pid=8 'bash' running>"
