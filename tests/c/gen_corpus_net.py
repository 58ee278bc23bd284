"""Writes the seed corpus of fuzz_net_relay into corpus_net/: guest -> host NET port streams
(net_protocol.h), valid lives of streams and typical violations. Each file starts with the
fuzzer's 2-byte split seed. Run: python3 tests/c/gen_corpus_net.py tests/c/corpus_net"""

import struct
import sys
from pathlib import Path

OPEN, CONNECTED, REFUSED, DATA, CREDIT, SHUTDOWN, CLOSE = 48, 49, 50, 120, 121, 122, 123
# The window fuzz_net_relay is built with (tests/c/Makefile), and the largest NET_DATA.
FUZZ_NET_WINDOW, DATA_MAX = 128 * 1024, 60 * 1024


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IBBHI", len(payload), kind, 0, 0, stream) + payload


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def open_(stream: int, name: bytes, port: int) -> bytes:
    return frame(OPEN, stream, u32(port) + u32(len(name)) + name)


def refused(what: int, port: int, count: int, subject: bytes) -> bytes:
    return frame(REFUSED, 0, u32(what) + u32(port) + u32(count) + u32(len(subject)) + subject)


SEEDS = {
    "open_data_close": open_(1, b"example.org", 443)
    + frame(DATA, 1, b"GET / HTTP/1.0\r\n\r\n")
    + frame(SHUTDOWN, 1)
    + frame(CREDIT, 1, u32(1))
    + frame(CLOSE, 1, u32(0)),
    "two_streams": open_(1, b"a.example", 80)
    + open_(3, b"b.example", 8080)
    + frame(DATA, 3, b"x" * 1000)
    + frame(CLOSE, 1, u32(1))
    + frame(DATA, 3, b"y"),
    "connected": frame(CONNECTED, 0x80000000, u32(0)),
    # Stream 3: the fuzz target gives it a peer that never reads (bit 1 of its id).
    "window_overrun": open_(3, b"a.example", 80)
    + frame(DATA, 3, b"z" * DATA_MAX) * (FUZZ_NET_WINDOW // DATA_MAX + 1),
    "bad_name": open_(1, b"A..b", 80),
    # NET_OPENED (112): a type only the host sends, coming from the guest.
    "opened_from_guest": frame(112, 1, u32(0) + u32(0)),
    "max_frame": frame(DATA, 1, b"q" * 65536),
    # What the guest refused itself: a name, an address, a count its rate limit left out; then
    # more than the relay's burst (the rest is counted).
    "refused": refused(0, 0, 1, b"blocked.example")
    + refused(1, 443, 1, b"8.8.8.8")
    + refused(2, 0, 7, b"")
    + open_(1, b"a.example", 80),
    "refused_flood": refused(1, 80, 1, b"198.19.0.9") * 80,
}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, (name, data) in enumerate(SEEDS.items()):
        (out / f"seed_{name}").write_bytes(struct.pack("<H", 1 + 97 * i) + data)


if __name__ == "__main__":
    main()
