"""Host tools (host_tools.HostTools) and rich outputs (vm.execution.RichOutputs): the host's
half of a guest's TOOL_CALL and OUTPUT frames, without a VM. What the guest code sees of them is
tested in real VMs (tests/integration/functional/test_rich_outputs.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import pytest

from exec_sandbox import InputValidationError, Output, Scheduler
from exec_sandbox.host_tools import TOOL_ERROR, TOOL_OK, TOOL_RESULT_MAX, HostTools
from exec_sandbox.vm.execution import (
    OUTPUT_BEGIN,
    OUTPUT_END,
    OUTPUT_ITEM_MAX,
    OUTPUTS_MAX,
    RichOutputs,
)


def _args(*args: object, **kwargs: object) -> bytes:
    return json.dumps({"args": list(args), "kwargs": kwargs}).encode()


def test_sync_tool_runs_off_the_loop_and_returns_json() -> None:
    loop_thread: list[int] = []
    ran_in: list[int] = []

    def add(a: int, b: int = 0) -> dict[str, int]:
        ran_in.append(threading.get_ident())
        return {"sum": a + b}

    async def main() -> tuple[int, bytes, object]:
        loop_thread.append(threading.get_ident())
        return await HostTools({"add": add}).call("add", _args(2, b=3))

    status, body, record = asyncio.run(main())
    assert status == TOOL_OK
    assert json.loads(body) == {"sum": 5}
    assert ran_in and ran_in != loop_thread  # a blocking tool never holds the loop
    assert record.name == "add" and record.ok and record.error is None  # type: ignore[attr-defined]
    assert json.loads(record.arguments) == {"args": [2], "kwargs": {"b": 3}}  # type: ignore[attr-defined]


def test_async_tool_is_awaited() -> None:
    async def search(query: str) -> list[str]:
        await asyncio.sleep(0)
        return [query.upper()]

    status, body, _ = asyncio.run(HostTools({"search": search}).call("search", _args("x")))
    assert (status, json.loads(body)) == (TOOL_OK, ["X"])


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("missing", _args(), "no tool named 'missing' (tools: boom, ok)"),
        ("boom", _args(), "RuntimeError: the host says no"),
        ("ok", b"{not json", "not JSON"),
        ("ok", b"[1, 2]", '{"args": [...], "kwargs": {...}}'),
        ("ok", b'{"args": {}, "kwargs": {}}', '{"args": [...], "kwargs": {...}}'),
        ("ok", _args(1, 2, 3), "TypeError"),  # the function's own signature decides
    ],
)
def test_failures_reach_the_guest_as_messages(name: str, arguments: bytes, message: str) -> None:
    def boom() -> None:
        raise RuntimeError("the host says no")

    tools = HostTools({"boom": boom, "ok": lambda: 1})
    status, body, record = asyncio.run(tools.call(name, arguments))
    assert status == TOOL_ERROR
    assert message in body.decode()
    assert not record.ok and record.error is not None and message in record.error


def test_results_that_are_not_json_or_too_big_fail_the_call() -> None:
    tools = HostTools({"obj": lambda: object(), "big": lambda: "x" * TOOL_RESULT_MAX})
    status, body, _ = asyncio.run(tools.call("obj", _args()))
    assert status == TOOL_ERROR and b"not JSON serializable" in body
    status, body, _ = asyncio.run(tools.call("big", _args()))
    assert status == TOOL_ERROR and b"over the" in body


@pytest.mark.parametrize(
    "tools",
    [
        {"has space": print},
        {"1st": print},
        {"_private": print},
        {"x" * 65: print},
        {"fine": "not callable"},
        [("a", print)],
    ],
)
def test_bad_tools_are_refused_before_any_vm(tools: object) -> None:
    with pytest.raises(InputValidationError):
        HostTools(tools)  # type: ignore[arg-type]


def test_scheduler_run_refuses_bad_tools_before_starting() -> None:
    async def main() -> None:
        # Never entered: the check comes before the scheduler starts anything.
        await Scheduler().run("print(1)", tools={"bad name": print})

    with pytest.raises(InputValidationError):
        asyncio.run(main())


def _feed(outputs: RichOutputs, flags: int, mime: str = "", data: bytes = b"") -> str | None:
    return outputs.feed(flags, mime, data)


def test_outputs_are_assembled_in_order_text_as_str() -> None:
    outputs = RichOutputs()
    assert _feed(outputs, OUTPUT_BEGIN, "image/png", b"\x89PN") is None
    assert _feed(outputs, 0, "", b"G") is None
    assert _feed(outputs, OUTPUT_END, "", b"\r\n") is None
    assert _feed(outputs, OUTPUT_BEGIN | OUTPUT_END, "text/html", "<b>é</b>".encode()) is None
    assert _feed(outputs, OUTPUT_BEGIN | OUTPUT_END, "application/json", b"{}") is None
    assert outputs.outputs == [
        Output("image/png", b"\x89PNG\r\n"),
        Output("text/html", "<b>é</b>"),
        Output("application/json", "{}"),
    ]


def test_output_protocol_violations_are_reported() -> None:
    outputs = RichOutputs()
    assert _feed(outputs, 0, "", b"x") is not None  # data outside an output
    outputs = RichOutputs()
    _feed(outputs, OUTPUT_BEGIN, "text/plain")
    assert _feed(outputs, OUTPUT_BEGIN, "text/plain") is not None  # nested BEGIN
    outputs = RichOutputs()
    _feed(outputs, OUTPUT_BEGIN, "image/png")
    assert _feed(outputs, 0, "", b"x" * OUTPUT_ITEM_MAX) is None
    assert _feed(outputs, OUTPUT_END, "", b"x") is not None  # one byte over an output's limit
    outputs = RichOutputs()
    for _ in range(OUTPUTS_MAX):
        assert _feed(outputs, OUTPUT_BEGIN | OUTPUT_END, "text/plain", b"1") is None
    assert _feed(outputs, OUTPUT_BEGIN | OUTPUT_END, "text/plain", b"1") is not None


def test_tool_call_log_is_bounded_however_many_calls_the_code_makes() -> None:
    # Code that calls in a loop with 60 KiB of arguments: the host runs every call, but its log
    # (ExecutionResult.tool_calls) keeps a bounded number of records and of characters.
    from exec_sandbox.vm.execution import (
        TOOL_CALL_LOG_MAX,
        TOOL_CALL_LOG_TEXT_MAX,
        Execution,
        OutputStream,
    )
    from exec_sandbox.vm.guest import GuestVm

    sent: list[tuple[int, int, int]] = []

    async def main() -> Execution:
        loop = asyncio.get_running_loop()
        run = Execution(
            stdout=OutputStream("stdout", None),
            stderr=OutputStream("stderr", None),
            done=loop.create_future(),
            tools=HostTools({"echo": lambda text: len(text)}),
        )
        vm = SimpleNamespace(
            send_tool_result=lambda exec_id, call, status, body: (
                sent.append((exec_id, call, status)) or 0
            )
        )
        fake = SimpleNamespace(_broken=None, _runs={7: run}, _vm=vm, _want_write=lambda n: None)
        arguments = _args("x" * (60 * 1024 - 32))
        for call in range(1, TOOL_CALL_LOG_MAX + 200):
            await GuestVm._serve_call(fake, 7, run, call, "echo", arguments)  # type: ignore[arg-type]
        return run

    run = asyncio.run(main())
    assert len(sent) == TOOL_CALL_LOG_MAX + 199  # every call was answered
    assert all(status == TOOL_OK for _, _, status in sent)
    assert len(run.tool_calls) == TOOL_CALL_LOG_MAX
    assert run.tool_calls_dropped == 199
    kept = sum(len(c.arguments) + len(c.error or "") for c in run.tool_calls)
    assert kept <= TOOL_CALL_LOG_TEXT_MAX + TOOL_CALL_LOG_MAX * 400, kept
    assert run.tool_calls[0].arguments == _args("x" * (60 * 1024 - 32)).decode()
    assert run.tool_calls[-1].arguments.endswith("characters, cut)")
    assert all(c.name == "echo" and c.ok for c in run.tool_calls)


def test_a_call_stops_counting_when_its_result_leaves() -> None:
    # 16 calls in flight; the guest frees a call's place as soon as its result arrives and may
    # send the next call at once, which the loop can read before the finished call's task has
    # run its done callbacks. That next call must not count as a 17th, which costs the VM.
    from exec_sandbox import _execsbx
    from exec_sandbox.vm.execution import TOOL_CALLS_MAX, Execution, OutputStream
    from exec_sandbox.vm.guest import GuestVm

    async def main() -> tuple[Execution, list[str]]:
        loop = asyncio.get_running_loop()
        release = asyncio.Event()

        async def slow() -> int:
            await release.wait()
            return 1

        run = Execution(
            stdout=OutputStream("stdout", None),
            stderr=OutputStream("stderr", None),
            done=loop.create_future(),
            tools=HostTools({"slow": slow}),
        )
        vm = GuestVm.__new__(GuestVm)
        closed: list[str] = []
        next_call = iter(range(100, 1000))

        def send_tool_result(exec_id: int, call: int, status: int, body: bytes) -> int:
            # A fast guest: the result is in, the place is free, the next call comes in the
            # same turn of the loop.
            if call < 100:
                event = _execsbx.ToolCallEvent(("tool_call", 7, next(next_call), "slow", b"{}"))
                vm._dispatch(event)
            return 0

        vm._broken = None
        vm._runs = {7: run}
        vm._acks = {}
        vm._replies = {}
        vm._loop = loop
        vm._vm = SimpleNamespace(send_tool_result=send_tool_result)
        vm._want_write = lambda pending: None  # type: ignore[method-assign]
        vm.close = lambda: closed.append("closed")  # type: ignore[method-assign]
        for call in range(1, TOOL_CALLS_MAX + 1):
            vm._dispatch(_execsbx.ToolCallEvent(("tool_call", 7, call, "slow", b"{}")))
        await asyncio.sleep(0)
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        for task in list(run.calls):
            task.cancel()
        await asyncio.sleep(0)
        return run, closed

    run, closed = asyncio.run(main())
    assert closed == [] and not run.done.done(), run.done


def test_dataclasses_and_pydantic_models_are_sent_as_their_fields_at_any_depth() -> None:
    import dataclasses

    import pydantic

    @dataclasses.dataclass
    class Hit:
        title: str

    class Page(pydantic.BaseModel):
        hits: list[int]

    tools = HostTools({"search": lambda: {"hits": [Hit("a"), Hit("b")], "page": Page(hits=[1])}})
    status, body, _ = asyncio.run(tools.call("search", _args()))
    assert status == TOOL_OK
    assert json.loads(body) == {"hits": [{"title": "a"}, {"title": "b"}], "page": {"hits": [1]}}


def test_a_result_that_is_not_json_names_the_tool_and_says_it_was_the_result() -> None:
    status, body, _ = asyncio.run(HostTools({"weird": lambda: {1, 2}}).call("weird", _args()))
    assert status == TOOL_ERROR
    assert body.decode().startswith("tool 'weird' returned a value that is not JSON")


def test_a_keyword_is_not_a_tool_name() -> None:
    with pytest.raises(InputValidationError, match="keyword"):
        HostTools({"class": print})
