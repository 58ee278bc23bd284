"""Host tools for the code-mode tests of CodeAct and LlamaIndex's CodeActAgent: one sync, one
async, both recording their calls on the host, and the code blocks a scripted model sends.

No `from __future__ import annotations`: the frameworks print the tools' signatures into their
prompts, and the tests check them as a model reads them (`query: str`, not `query: 'str'`)."""

import asyncio
from collections.abc import Awaitable, Callable

from .conftest import SHOW_PNG_CODE

Calls = list[tuple[str, str]]


def recorded_tools() -> tuple[Calls, Callable[[str], list[str]], Callable[[str], Awaitable[int]]]:
    """(the host-side record of calls, search, price): `search("broken")` raises."""
    calls: Calls = []

    def search(query: str) -> list[str]:
        """Search the catalogue; returns the names of the matching items."""
        calls.append(("search", query))
        if query == "broken":
            raise ValueError("the catalogue is offline")
        return [f"{query}-a", f"{query}-bb"]

    async def price(item: str) -> int:
        """The price of an item, in euros."""
        await asyncio.sleep(0)
        calls.append(("price", item))
        return len(item)

    return calls, search, price


# Step one binds a variable; step two, another code block, uses it, calls the async tool, meets
# a tool's error as an exception, and shows a figure (named in the text the model reads).
STEP_ONE = 'hits = search("book")\nprint("hits", hits)'
STEP_TWO = (
    "total = sum(price(h) for h in hits)\n"
    'print("total", total)\n'
    "try:\n"
    '    search("broken")\n'
    "except Exception as exc:\n"
    '    print("caught", type(exc).__name__, exc)\n' + SHOW_PNG_CODE
)
EXPECTED_CALLS = [
    ("search", "book"),
    ("price", "book-a"),
    ("price", "book-bb"),
    ("search", "broken"),
]


def assert_step_outputs(first: str, second: str) -> None:
    """What the model must have read after each step."""
    assert "hits ['book-a', 'book-bb']" in first, first
    assert "total 13" in second, second
    assert "caught ToolError ValueError: the catalogue is offline" in second, second
    assert "[output: image/png," in second, second
