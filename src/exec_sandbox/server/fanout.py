"""One guest reader per process stream, however many clients watch it.

A reader of a process's output holds one of the VM's pending guest reads while it waits for
output, and a VM has a fixed number of those (the channel's held requests): one reader per
attached client would run out of them with a few dozen clients, the rest falling back to
polling. So the server reads each stream once (`StreamFanout`) and hands every chunk to the
clients attached to it, each through a queue of its own (`Subscriber`). The reader goes at the
guest's pace and never waits for a client: one that falls more than BEHIND_BYTES behind is
dropped (and may attach again) while the others go on, so no client holds up another and what
the server holds for one is bounded.

A client that attaches late gets what the fan-out still holds (the stream's last REPLAY_BYTES,
as much as the guest itself keeps), then the live output, as a reader of its own would. The
reader stops when the stream ends or when its last client leaves; the next client starts a new
one, which replays from the guest's buffer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

from ..processes import Process

# What a fan-out keeps for late clients: as much as the guest keeps of a stream.
REPLAY_BYTES = 1 << 20
# A client more than this behind the reader (beyond the replay it got when it attached) is
# dropped: what the server holds for one client is bounded, and the reader never waits for one.
BEHIND_BYTES = 4 << 20

_Key = tuple[str, int, str]  # session id, pid, stream


class Subscriber:
    """One client's view of a stream: its chunks in order, then the end (or the reader's
    failure). `too_slow` once it fell more than its limit behind: nothing more is queued and
    its iteration ends after what was queued."""

    def __init__(self, limit: int) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._pending = 0
        self._limit = limit
        self.too_slow = False
        self.failure: BaseException | None = None

    def put(self, chunk: bytes) -> bool:
        """Queue chunk; False (and the end queued) when that would pass the limit."""
        if self.too_slow:
            return False
        if self._pending + len(chunk) > self._limit:
            self.too_slow = True
            self._queue.put_nowait(None)
            return False
        self._pending += len(chunk)
        self._queue.put_nowait(chunk)
        return True

    def end(self, failure: BaseException | None) -> None:
        self.failure = failure
        self._queue.put_nowait(None)

    def __aiter__(self) -> Subscriber:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._queue.get()
        if chunk is None:
            raise StopAsyncIteration
        self._pending -= len(chunk)
        return chunk


class StreamFanout:
    """The one reader of a stream and the clients attached to it."""

    def __init__(self, reader: AsyncIterator[bytes], on_idle: Callable[[], None]) -> None:
        self._held: collections.deque[bytes] = collections.deque()
        self._held_bytes = 0
        self._subscribers: set[Subscriber] = set()
        self._on_idle = on_idle
        self._ended = False
        self._failure: BaseException | None = None
        self._task = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in reader:
                self._hold(chunk)
                for subscriber in list(self._subscribers):
                    if not subscriber.put(chunk):
                        self._subscribers.discard(subscriber)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client gets it as the stream's error
            self._failure = exc
        self._ended = True
        for subscriber in self._subscribers:
            subscriber.end(self._failure)

    def _hold(self, chunk: bytes) -> None:
        self._held.append(chunk)
        self._held_bytes += len(chunk)
        while self._held_bytes > REPLAY_BYTES and len(self._held) > 1:
            self._held_bytes -= len(self._held.popleft())

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber(self._held_bytes + BEHIND_BYTES)
        for chunk in self._held:
            subscriber.put(chunk)
        if self._ended:
            subscriber.end(self._failure)
        else:
            self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)
        if not self._subscribers:
            self._task.cancel()
            self._on_idle()  # the registry forgets this fan-out (if it still has it)


class Fanouts:
    """The fan-outs of one server, by process and stream; each removed with its last client."""

    def __init__(self) -> None:
        self._fanouts: dict[_Key, StreamFanout] = {}

    @contextlib.contextmanager
    def attach(self, session_id: str, process: Process, stream: str) -> Iterator[Subscriber]:
        """A client's subscription to stream ("stdout" or "stderr") of process, for the
        duration of the context."""
        key = (session_id, process.pid, stream)
        fanout = self._fanouts.get(key)
        if fanout is None:
            reader = process.stdout if stream == "stdout" else process.stderr

            def forget() -> None:
                if self._fanouts.get(key) is fanout:
                    del self._fanouts[key]

            fanout = StreamFanout(reader, forget)
            self._fanouts[key] = fanout
        subscriber = fanout.subscribe()
        try:
            yield subscriber
        finally:
            fanout.unsubscribe(subscriber)

    def __len__(self) -> int:
        return len(self._fanouts)
