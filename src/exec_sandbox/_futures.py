"""Futures whose outcome nobody awaits any more."""

from __future__ import annotations

import asyncio
from typing import Any


def retrieve(future: asyncio.Future[Any]) -> None:
    """Consume a finished future's outcome, so that an error nobody is left to take (the caller
    gave up, or another error is being raised) is not logged as "never retrieved". Also a done
    callback: `future.add_done_callback(retrieve)`."""
    if not future.cancelled():
        future.exception()
