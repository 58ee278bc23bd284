"""Fuzzer of the host's HTTP interception (exec_sandbox/network/intercept.py: our wrapper around
h11, the header rewriting, the limits): mutated request streams are written by a stand-in guest
over a socketpair (no VM: this drives the code that parses the guest's bytes, nothing else),
against a stand-in real host that answers every request. Each input must end with the
interception returning within its time bounds, no exception escaping it, the guest getting
either nothing or a response that starts like one, and the real host never receiving the
secret's value in a request to a host it is not for (there is none: it may only appear
where the placeholder stood in a header).

    python -m tests.fuzz.fuzz_intercept [seconds] [seed]     (make fuzz runs it)
"""

from __future__ import annotations

import asyncio
import random
import socket
import sys
import time

import h11

from exec_sandbox.network import intercept
from exec_sandbox.network.secrets import BoundSecret, HostSecrets, SecretHost

PLACEHOLDER = "sbx-secret-00112233445566778899aabbccddeeff"
VALUE = "the-real-value"
SEEDS = [
    b"GET / HTTP/1.1\r\nHost: web.test\r\nAuthorization: Bearer "
    + PLACEHOLDER.encode()
    + b"\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: web.test\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /c HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: web.test\r\n\r\nGET /b HTTP/1.1\r\nHost: web.test\r\n\r\n",
    b"GET /u HTTP/1.1\r\nHost: web.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
]
REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif op == 1:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 2 and out:
            del out[at : at + rng.randint(1, 16)]
        elif op == 3:
            piece = rng.choice(SEEDS)
            out[at:at] = piece[: rng.randint(0, len(piece))]
        elif op == 4:
            out[at:at] = rng.choice(
                [b"\r\n", b":", b" ", b"\x00", b"X-A: b\r\n" * 50, b"a" * 70000]
            )
        else:
            out = out[:at]
    return bytes(out)


async def _upstream(sock: socket.socket, seen: list[bytes]) -> None:
    """Answer anything that looks like a request head, record what came."""
    loop = asyncio.get_running_loop()
    buf = b""
    try:
        while True:
            data = await loop.sock_recv(sock, 65536)
            if not data:
                return
            seen.append(data)
            buf += data
            while b"\r\n\r\n" in buf:
                _, buf = buf.split(b"\r\n\r\n", 1)
                await loop.sock_sendall(sock, REPLY)
    except OSError:
        return
    finally:
        sock.close()


async def one(data: bytes) -> tuple[bytes, bytes]:
    loop = asyncio.get_running_loop()
    guest, ours = socket.socketpair()
    up_theirs, up_ours = socket.socketpair()
    for s in (guest, ours, up_theirs, up_ours):
        s.setblocking(False)
    secret = BoundSecret("API_KEY", VALUE, (SecretHost("web.test"),), PLACEHOLDER)
    rules = HostSecrets([secret], [("X-Rule", "r")])
    records = []
    interception = intercept.Interception("web.test", 80, rules, records.append)
    seen: list[bytes] = []
    up_task = asyncio.ensure_future(_upstream(up_theirs, seen))
    task = asyncio.ensure_future(interception.serve(ours, up_ours, None, None))
    try:
        await loop.sock_sendall(guest, data)
    except OSError:
        pass
    guest.shutdown(socket.SHUT_WR)
    reply = b""
    try:
        async with asyncio.timeout(10):
            while True:
                chunk = await loop.sock_recv(guest, 65536)
                if not chunk:
                    break
                reply += chunk
            await task
    finally:
        guest.close()
        task.cancel()
        up_task.cancel()
        await asyncio.gather(task, up_task, return_exceptions=True)
    if task.exception() is not None and not task.cancelled():
        raise AssertionError(f"serve raised {task.exception()!r} for {data[:200]!r}")
    assert reply == b"" or reply.startswith(b"HTTP/1.1 "), (data[:200], reply[:200])
    upstream = b"".join(seen)
    if VALUE.encode() in upstream:
        _value_only_in_heads(upstream, data)
    return reply, upstream


def _value_only_in_heads(upstream: bytes, data: bytes) -> None:
    """The value may only be in request heads (where a placeholder stood), never in a body:
    the upstream bytes (written by the interception's h11 client) are read back as requests."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
    conn.receive_data(upstream)
    conn.receive_data(b"")
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return  # the tail of a request cut off by the end of the exchange
        if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            if event is h11.PAUSED and conn.their_state is h11.DONE:
                conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                conn.send(h11.EndOfMessage())
                conn.start_next_cycle()
                continue
            return
        if isinstance(event, h11.Data):
            assert VALUE.encode() not in event.data, (data[:200], upstream[:300])


async def run(seconds: float, seed: int) -> int:
    saved = intercept.HEAD_TIMEOUT_SECONDS, intercept.LINGER_SECONDS
    intercept.HEAD_TIMEOUT_SECONDS, intercept.LINGER_SECONDS = 2.0, 0.2
    try:
        return await _run(seconds, seed)
    finally:
        intercept.HEAD_TIMEOUT_SECONDS, intercept.LINGER_SECONDS = saved


async def _run(seconds: float, seed: int) -> int:
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    count = 0
    # The harness itself works: a valid request gets the real host's answer and the value.
    reply, upstream = await one(SEEDS[0])
    assert reply.startswith(b"HTTP/1.1 200") and b"Bearer " + VALUE.encode() in upstream, reply
    for data in SEEDS:
        await one(data)
        count += 1
    while time.monotonic() < deadline:
        await one(mutate(rng, rng.choice(SEEDS)))
        count += 1
    return count


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else random.randrange(1 << 32)
    count = asyncio.run(run(seconds, seed))
    print(f"fuzz_intercept: {count} inputs, seed {seed}, no failure")


if __name__ == "__main__":
    main()
