"""GuestVm's reply table for process requests (vm/guest.py, proc_request), without a VM: a
GuestVm made bare, events handed to its dispatcher as the C decoder would type them. Says
nothing about a real guest (tests/integration/functional/test_processes.py does)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from exec_sandbox import _execsbx
from exec_sandbox.errors import CommunicationOutcomeUnknownError, GuestAgentError
from exec_sandbox.vm.guest import GuestRequestError, GuestVm


def bare_vm(loop: asyncio.AbstractEventLoop, sent: list[int]) -> tuple[GuestVm, list[str]]:
    vm = GuestVm.__new__(GuestVm)
    closed: list[str] = []
    ready: asyncio.Future[None] = loop.create_future()
    ready.set_result(None)
    vm._loop = loop
    vm._broken = None
    vm._ready = ready
    vm._acks = {}
    vm._replies = {}
    vm._runs = {}
    vm._transfers = {}
    vm._flushed = []
    vm._next_id = 500
    vm._vm = SimpleNamespace()
    vm._want_write = lambda pending: None  # type: ignore[method-assign]
    vm.close = lambda: closed.append("closed")  # type: ignore[method-assign]

    def send(raw: Any, req_id: int) -> int:
        sent.append(req_id)
        return 0

    vm.test_send = send  # type: ignore[attr-defined]
    return vm, closed


async def test_the_answer_of_its_id_resolves_a_request_and_others_are_ignored() -> None:
    sent: list[int] = []
    vm, closed = bare_vm(asyncio.get_running_loop(), sent)
    request = asyncio.ensure_future(vm.proc_request(vm.test_send, "proc_data", 5))  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    (req_id,) = sent
    # Answers nobody waits for (a guest that held a read for the host process before a
    # resume): dropped, whatever their kind.
    vm._dispatch(_execsbx.ProcDataEvent(("proc_data", req_id + 1, 0, 0, b"stale")))
    vm._dispatch(_execsbx.ProcInfoEvent(("proc_info", 7, [])))
    assert not request.done()
    vm._dispatch(_execsbx.ProcDataEvent(("proc_data", req_id, 3, 0, b"mine")))
    event = await request
    assert (event.kind, event.offset, event.data) == ("proc_data", 3, b"mine")
    assert vm._replies == {} and closed == []


async def test_an_error_raises_with_its_code_and_keeps_the_vm() -> None:
    sent: list[int] = []
    vm, closed = bare_vm(asyncio.get_running_loop(), sent)
    request = asyncio.ensure_future(vm.proc_request(vm.test_send, "pong", 5))  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    vm._dispatch(_execsbx.ErrorEvent(("error", sent[0], 5, "no such process")))
    with pytest.raises(GuestRequestError) as info:
        await request
    assert (info.value.code, info.value.guest_message) == (5, "no such process")
    assert closed == [] and vm._broken is None


async def test_an_answer_of_another_kind_costs_the_vm() -> None:
    sent: list[int] = []
    vm, closed = bare_vm(asyncio.get_running_loop(), sent)
    request = asyncio.ensure_future(vm.proc_request(vm.test_send, "proc_info", 5))  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    vm._dispatch(_execsbx.AckEvent(("pong", sent[0])))
    with pytest.raises(GuestAgentError, match="expecting proc_info with pong"):
        await request
    assert closed == ["closed"] and vm._broken is not None


async def test_a_failing_vm_fails_every_waiting_request() -> None:
    sent: list[int] = []
    vm, _ = bare_vm(asyncio.get_running_loop(), sent)
    requests = [
        asyncio.ensure_future(vm.proc_request(vm.test_send, "proc_data", 60))  # type: ignore[attr-defined]
        for _ in range(3)
    ]
    await asyncio.sleep(0)
    assert len(set(sent)) == 3  # one id each
    vm._fail(CommunicationOutcomeUnknownError("the channel to the guest was closed"))
    for request in requests:
        with pytest.raises(CommunicationOutcomeUnknownError):
            await asyncio.wait_for(request, 1)
    # And a request after that fails at once.
    with pytest.raises(CommunicationOutcomeUnknownError):
        await vm.proc_request(vm.test_send, "pong", 5)  # type: ignore[attr-defined]
