"""Blocking work in an executor thread, for the coroutines of the caches and stores."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


async def in_thread(work: Callable[[], _T], *, discard: Callable[[_T], None] | None = None) -> _T:
    """work() in the default executor. A thread cannot be stopped: if the caller is cancelled
    meanwhile (Scheduler.close() cancels builds), this still waits for work to end before it
    re-raises, so the next step (a directory's removal, close() returning) never races it; what
    work made for a caller that is gone (an fd, a directory) goes to discard."""
    future = asyncio.get_running_loop().run_in_executor(None, work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait({future})
        if not future.cancelled() and future.exception() is None and discard is not None:
            discard(future.result())
        raise
