"""A plain-asyncio host relay for the network port, used ONLY by bench/network.py as the
baseline the C/io_uring relay (src/_execsbx/net_relay.c) is measured against. Same protocol,
same flow control (credits sent once bytes are written to the peer socket), same policy calls;
none of the C relay's hard limits or violation handling: it trusts the guest, and must never be
used outside the bench."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from typing import Any

from exec_sandbox.network import policy as p

HEADER = struct.Struct("<IBBHI")
OPEN, OPENED, DATA, CREDIT, SHUTDOWN, CLOSE = 48, 112, 120, 121, 122, 123
WINDOW, DATA_MAX = 1024 * 1024, 60 * 1024


class _Stream:
    def __init__(self) -> None:
        self.credit = WINDOW
        self.credited = asyncio.Event()
        self.credited.set()
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.writer: asyncio.StreamWriter | None = None
        self.ended = 0  # directions finished; at 2 the stream closes


class AsyncioRelay:
    """Stands where network.hub.VmNetwork stands (serve/close/exposed/log), outbound only."""

    def __init__(self, port_fd: int, policy: p.NetworkPolicy) -> None:
        self.policy = policy
        self.exposed: list[Any] = []
        self.log: list[Any] = []
        self._sock = socket.socket(fileno=os.dup(port_fd))
        self._sock.setblocking(False)
        self._streams: dict[int, _Stream] = {}
        self._task = asyncio.get_running_loop().create_task(self._run())

    def serve(self, listeners: list[Any]) -> None:
        assert not listeners, "the baseline relay has no exposed ports"

    def close(self) -> list[Any]:
        self._task.cancel()
        for stream in self._streams.values():
            for task in stream.tasks:
                task.cancel()
            if stream.writer is not None:
                stream.writer.close()
        self._streams.clear()
        self._sock.close()
        return []

    def _send(self, kind: int, stream: int, payload: bytes = b"") -> None:
        self._port.write(HEADER.pack(len(payload), kind, 0, 0, stream) + payload)

    async def _run(self) -> None:
        reader, self._port = await asyncio.open_connection(sock=self._sock)
        while True:
            length, kind, _f, _r, stream = HEADER.unpack(await reader.readexactly(HEADER.size))
            payload = await reader.readexactly(length)
            if kind == OPEN:
                port, n = struct.unpack_from("<II", payload)
                name = payload[8 : 8 + n].decode()
                state = self._streams[stream] = _Stream()
                state.tasks.append(asyncio.create_task(self._open(stream, state, name, port)))
            elif (state := self._streams.get(stream)) is None:
                continue
            elif kind == DATA:
                state.inbound.put_nowait(payload)
            elif kind == CREDIT:
                state.credit += struct.unpack("<I", payload)[0]
                state.credited.set()
            elif kind == SHUTDOWN:
                state.inbound.put_nowait(None)
            elif kind == CLOSE:
                self._streams.pop(stream, None)
                for task in state.tasks:
                    task.cancel()
                if state.writer is not None:
                    state.writer.close()

    async def _open(self, stream: int, state: _Stream, name: str, port: int) -> None:
        try:
            if why := self.policy.check(name, port):
                raise p.Refused(p.REFUSED_POLICY, why)
            targets = await p.resolve(self.policy, name, port)
            reader, writer = await asyncio.open_connection(*targets[0])
        except p.Refused as exc:
            self._streams.pop(stream, None)
            reason = exc.reason.encode()[:256]
            self._send(OPENED, stream, struct.pack("<II", exc.status, len(reason)) + reason)
            return
        except OSError as exc:
            self._streams.pop(stream, None)
            reason = str(exc).encode()[:256]
            self._send(OPENED, stream, struct.pack("<II", p.CONNECT_FAILED, len(reason)) + reason)
            return
        state.writer = writer
        self._send(OPENED, stream, struct.pack("<II", 0, 0))
        state.tasks.append(asyncio.create_task(self._to_peer(stream, state, writer)))
        await self._to_guest(stream, state, reader)

    async def _to_guest(self, stream: int, state: _Stream, reader: asyncio.StreamReader) -> None:
        while True:
            while state.credit <= 0:
                state.credited.clear()
                await state.credited.wait()
            data = await reader.read(min(DATA_MAX, state.credit))
            if not data:
                self._send(SHUTDOWN, stream)
                self._direction_done(stream, state)
                return
            state.credit -= len(data)
            self._send(DATA, stream, data)
            await self._port.drain()

    async def _to_peer(self, stream: int, state: _Stream, writer: asyncio.StreamWriter) -> None:
        while (data := await state.inbound.get()) is not None:
            writer.write(data)
            await writer.drain()
            self._send(CREDIT, stream, struct.pack("<I", len(data)))
        writer.write_eof()
        await writer.drain()
        self._direction_done(stream, state)

    def _direction_done(self, stream: int, state: _Stream) -> None:
        state.ended += 1
        if state.ended == 2:
            self._send(CLOSE, stream, struct.pack("<I", 0))


class AsyncioHub:
    """Stands where network.hub.NetworkHub stands for Scheduler._hub()."""

    def attach(self, port_fd: int, policy: p.NetworkPolicy, on_violation: Any) -> AsyncioRelay:
        return AsyncioRelay(port_fd, policy)

    def close(self) -> None:
        pass
