"""A GUEST STAND-IN, not a VM: a process started in QEMU's place (the C core spawns it exactly as
it would spawn QEMU) that speaks the agent's wire protocol (src/shared/protocol.h) on the
channel at fd 3 and says what it is on the console at fd 4. Nothing runs in a guest: user code
is not executed, it is read as a script of what to answer (below). Unit tests of the host's
orchestration use it (tests/unit/guest_stand_in.py) so that their failure paths run in
milliseconds; whether the sandbox works is for the VM tests.

How it behaves comes from QEMU's `-append` argument (the kernel command line), tokens
`standin.version=N` (the protocol version READY says) and `standin.boot=MODE`:
    ready (default)  send READY and serve requests
    exit             write a reason to the console and exit 1 before READY (a failed start)
An EXEC's code is read line by line:
    out TEXT / err TEXT   one STDOUT / STDERR frame with TEXT and a newline
    exit N                the EXIT's code (default 0)
    stdout-limit          EXIT flagged "stdout over its limit"
    timeout               EXIT -1 flagged "timed out"
    die                   the stand-in exits at once (the channel closes mid-execution)
    sleep SECONDS         wait before going on
    hang                  never answer
Any other line is ignored (warm-up code and a session's start-up no-op end with exit 0).
PING and PRESTART get PONG, RESEED gets RESEEDED, file requests get FILE_ERROR. `--version`
prints a line, like `qemu --version`.
"""

import os
import struct
import sys
import time

CHANNEL_FD = 3
CONSOLE_FD = 4
QMP_FD = 5
HEADER = struct.Struct("<IBBHI")
MSG_READY, MSG_STDOUT, MSG_STDERR, MSG_EXIT, MSG_ERROR, MSG_PONG = 1, 2, 3, 4, 5, 6
MSG_FILE_ERROR, MSG_RESEEDED = 10, 32
MSG_EXEC, MSG_PING, MSG_SESSION_EXEC, MSG_RESEED, MSG_PRESTART = 64, 65, 66, 96, 97
FILE_REQUESTS = (67, 70, 71)  # write begin, read, list (each answered once)
EXIT_TIMED_OUT, EXIT_STDOUT_LIMIT = 1, 2
FILE_ERR_PROTOCOL = 5


def _option(name: str, default: str) -> str:
    """standin.NAME=VALUE from the kernel command line QEMU would have been given."""
    argv = sys.argv[1:]
    cmdline = argv[argv.index("-append") + 1] if "-append" in argv else ""
    for token in cmdline.split():
        if token.startswith(f"standin.{name}="):
            return token.split("=", 1)[1]
    return default


def _send(kind: int, req_id: int, payload: bytes = b"") -> None:
    data = HEADER.pack(len(payload), kind, 0, 0, req_id) + payload
    while data:
        data = data[os.write(CHANNEL_FD, data) :]


def _str(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def _read_exact(n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(CHANNEL_FD, n - len(out))
        if not chunk:
            sys.exit(0)  # the host closed the channel
        out += chunk
    return out


def _code_of(payload: bytes) -> bytes:
    pos = 1 + 4 * 3  # language, timeout, stdout limit, stderr limit
    (env_count,) = struct.unpack_from("<I", payload, pos)
    pos += 4
    for _ in range(env_count * 2):
        (length,) = struct.unpack_from("<I", payload, pos)
        pos += 4 + length
    (length,) = struct.unpack_from("<I", payload, pos)
    return payload[pos + 4 : pos + 4 + length]


def _execute(req_id: int, code: bytes) -> None:
    exit_code, flags = 0, 0
    for line in code.decode(errors="replace").splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "out":
            _send(MSG_STDOUT, req_id, rest.encode() + b"\n")
        elif word == "err":
            _send(MSG_STDERR, req_id, rest.encode() + b"\n")
        elif word == "exit":
            exit_code = int(rest)
        elif word == "stdout-limit":
            exit_code, flags = 1, EXIT_STDOUT_LIMIT  # as a REPL interrupted at its limit
        elif word == "timeout":
            exit_code, flags = -1, EXIT_TIMED_OUT
        elif word == "die":
            os._exit(3)
        elif word == "sleep":
            time.sleep(float(rest))
        elif word == "hang":
            return
    _send(MSG_EXIT, req_id, struct.pack("<iIQ", exit_code, flags, 1000))


def main() -> None:
    if sys.argv[1:2] == ["--version"]:
        print("exec-sandbox guest stand-in (not QEMU)")
        return
    os.write(CONSOLE_FD, b"GUEST STAND-IN: not a VM; speaking the agent protocol for unit tests\n")
    try:
        os.close(QMP_FD)  # no QMP here: a save or load over it fails at once
    except OSError:
        pass
    if _option("boot", "ready") == "exit":
        os.write(CONSOLE_FD, b"stand-in: refusing to boot (as asked)\n")
        sys.exit(1)
    version = int(_option("version", "1"))
    _send(MSG_READY, 0, struct.pack("<I", version) + _str(b"stand-in"))
    while True:
        length, kind, _flags, _reserved, req_id = HEADER.unpack(_read_exact(HEADER.size))
        payload = _read_exact(length)
        if kind in (MSG_PING, MSG_PRESTART):
            _send(MSG_PONG, req_id)
        elif kind == MSG_RESEED:
            _send(MSG_RESEEDED, req_id)
        elif kind in (MSG_EXEC, MSG_SESSION_EXEC):
            _execute(req_id, _code_of(payload))
        elif kind in FILE_REQUESTS:
            _send(
                MSG_FILE_ERROR,
                req_id,
                struct.pack("<I", FILE_ERR_PROTOCOL) + _str(b"the guest stand-in has no files"),
            )


if __name__ == "__main__":
    main()
