"""Client of the agent's host socket (docs/protocol.md, "Host tools and rich outputs").

Frames: a 12-byte header (u32 payload length, u8 type, u8 flags 0, u16 reserved 0, u32 request
id; little-endian), then the payload; strings are u32 length + bytes. Requests are LOCAL_CALL
(str name, str JSON arguments) and LOCAL_OUTPUT (str mime type, then the data); the agent answers
each with one LOCAL_REPLY (u8 status, str body) carrying the request's id.

One connection per process, opened at first use, opened again in a forked child (the parent's
socket is the parent's: replies to the child's requests would go to whichever process reads
first). Threads share it: each request takes a fresh id, and whichever waiting thread reads the
socket hands the replies of the others to them, so several calls can be in flight at once.
"""

import _socket
import os
import threading

from . import ToolError

SOCKET_ENV = "EXEC_SANDBOX_HOST_SOCKET"
DEFAULT_SOCKET = "/run/sbx/host.sock"

LOCAL_CALL = 1
LOCAL_OUTPUT = 2
LOCAL_REPLY = 3

STATUS_OK = 0
STATUS_ERROR = 1
STATUS_REFUSED = 2

HEADER_SIZE = 12
NAME_MAX = 64
ARGS_MAX = 60 * 1024
MIME_MAX = 127
OUTPUT_MAX = 4 * 1024 * 1024
# The agent's reply bodies are at most 1 MiB; anything over the agent's own frame limit is a
# broken stream.
FRAME_MAX = 4 * 1024 * 1024 + 4 * 1024


class HostUnreachable(Exception):
    """The socket could not be opened, or broke while a request waited for its reply."""


def _str(data: bytes) -> bytes:
    return len(data).to_bytes(4, "little") + data


def _valid_name(name: str) -> bool:
    if not 0 < len(name) <= NAME_MAX or not name.isascii():
        return False
    if not (name[0].isalpha() or name[0] == "_"):
        return False
    return all(c.isalnum() or c == "_" for c in name)


def valid_mime(mime: str) -> bool:
    """type/subtype of [a-z0-9.+_-], one '/', neither side empty, at most 127 bytes."""
    if not 0 < len(mime) <= MIME_MAX or not mime.isascii() or mime.count("/") != 1:
        return False
    kind, _, sub = mime.partition("/")
    allowed = "abcdefghijklmnopqrstuvwxyz0123456789.+_-"
    return bool(kind) and bool(sub) and all(c in allowed for c in kind + sub)


class _Waiter:
    __slots__ = ("reply", "sock")

    def __init__(self, sock: "_socket.socket") -> None:
        self.sock = sock
        self.reply: tuple[int, bytes] | BaseException | None = None


class Connection:
    """The process's connection; see the module's docstring."""

    def __init__(self, path: str) -> None:
        self.pid = os.getpid()
        self.path = path
        self.sock: _socket.socket | None = None
        self.cond = threading.Condition(threading.Lock())  # guards everything below
        self.send_lock = threading.Lock()
        self.next_id = 0
        self.waiters: dict[int, _Waiter] = {}
        self.reading = False

    def request(self, kind: int, payload: bytes) -> tuple[int, bytes]:
        """Send one request; return its reply's (status, body). Raises HostUnreachable."""
        with self.cond:
            if self.sock is None:
                self.sock = self._connect()
            sock = self.sock
            self.next_id = self.next_id % 0xFFFFFFFF + 1
            rid = self.next_id
            waiter = self.waiters[rid] = _Waiter(sock)
        header = len(payload).to_bytes(4, "little") + bytes((kind, 0, 0, 0))
        try:
            with self.send_lock:
                sock.sendall(header + rid.to_bytes(4, "little") + payload)
        except BaseException as exc:
            # Part of a frame may be out: the stream is unusable for everyone on it.
            with self.cond:
                self.waiters.pop(rid, None)
                self._break(sock, exc)
            if isinstance(exc, OSError):
                raise HostUnreachable(f"cannot write to the host socket: {exc}") from None
            raise
        try:
            reply = self._wait(waiter)
        finally:
            with self.cond:
                self.waiters.pop(rid, None)
        if isinstance(reply, BaseException):
            raise HostUnreachable(f"the host socket broke: {reply}") from None
        return reply

    def _connect(self) -> "_socket.socket":
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise HostUnreachable(f"cannot reach the host socket {self.path}: {exc}") from None
        return sock

    def _wait(self, waiter: _Waiter) -> "tuple[int, bytes] | BaseException":
        # Called with the lock not held. One waiting thread at a time reads (the reader); the
        # others sleep on the condition and are woken by each frame the reader hands out.
        with self.cond:
            while waiter.reply is None:
                if self.reading:
                    self.cond.wait()
                    continue
                sock = waiter.sock
                self.reading = True
                self.cond.release()
                frame: tuple[int, int, bytes] | None = None
                failure: BaseException | None = None
                try:
                    frame = _read_reply(sock)
                except BaseException as exc:
                    failure = exc
                finally:
                    self.cond.acquire()
                    self.reading = False
                    if failure is not None:
                        self._break(sock, failure)
                    elif frame is not None:
                        target = self.waiters.get(frame[0])
                        if target is not None and target.sock is sock:
                            target.reply = frame[1:]
                        # else: the reply of a request whose caller gave up (interrupted)
                    self.cond.notify_all()
                if failure is not None and not isinstance(failure, Exception):
                    raise failure  # KeyboardInterrupt and the like: the caller's, not ours
            return waiter.reply

    def _break(self, sock: "_socket.socket", exc: BaseException) -> None:
        """Drop a broken socket (lock held): its waiters get `exc`, the next request connects
        again."""
        if self.sock is sock:
            self.sock = None
            try:
                # Wakes a reader blocked on it in another thread.
                sock.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for waiter in self.waiters.values():
            if waiter.sock is sock and waiter.reply is None:
                waiter.reply = exc
        self.cond.notify_all()


def _recv_exactly(sock: "_socket.socket", size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("the agent closed the host socket")
        got += n
    return bytes(buf)


def _read_reply(sock: "_socket.socket") -> tuple[int, int, bytes]:
    """One LOCAL_REPLY: (request id, status, body)."""
    header = _recv_exactly(sock, HEADER_SIZE)
    length = int.from_bytes(header[0:4], "little")
    kind, flags, reserved = header[4], header[5], int.from_bytes(header[6:8], "little")
    rid = int.from_bytes(header[8:12], "little")
    if kind != LOCAL_REPLY or flags or reserved or not 5 <= length <= FRAME_MAX:
        raise ConnectionError(f"malformed frame from the agent (type {kind}, length {length})")
    payload = _recv_exactly(sock, length)
    body_len = int.from_bytes(payload[1:5], "little")
    if 5 + body_len != length:
        raise ConnectionError("malformed reply from the agent (body length)")
    return rid, payload[0], payload[5:]


_conn: Connection | None = None
_conn_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # The parent's lock may have been held by a thread that does not exist in the child, and
    # its socket is the parent's: close the child's copy of it only (a shutdown would end the
    # parent's connection).
    global _conn, _conn_lock
    _conn_lock = threading.Lock()
    if _conn is not None and _conn.sock is not None:
        _conn.sock.close()
    _conn = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def connection() -> Connection:
    global _conn
    conn = _conn
    pid = os.getpid()
    if conn is not None and conn.pid == pid:
        return conn
    with _conn_lock:
        if _conn is None or _conn.pid != pid:
            # A fork that bypassed os.register_at_fork (a C extension's fork()): the same as
            # _after_fork_in_child.
            if _conn is not None and _conn.sock is not None:
                _conn.sock.close()
            _conn = Connection(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)
        return _conn


def call(name: str, args: tuple, kwargs: dict) -> object:
    import json

    if not isinstance(name, str) or not _valid_name(name):
        raise ValueError(f"invalid tool name {name!r}: [A-Za-z_][A-Za-z0-9_]*, at most 64 bytes")
    try:
        arguments = json.dumps(
            {"args": list(args), "kwargs": kwargs},
            ensure_ascii=False,
            allow_nan=False,
            separators=(",", ":"),
        ).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"tools.{name}: arguments must be JSON-serialisable (str, int, float, bool, None, "
            f"list, dict with str keys): {exc}"
        ) from None
    if len(arguments) > ARGS_MAX:
        raise TypeError(
            f"tools.{name}: arguments are {len(arguments)} bytes of JSON, over the limit of "
            f"{ARGS_MAX} bytes"
        )
    try:
        status, body = connection().request(LOCAL_CALL, _str(name.encode()) + _str(arguments))
    except HostUnreachable as exc:
        raise ToolError(f"tools.{name}: {exc}", refused=True) from None
    text = body.decode("utf-8", "replace")
    if status == STATUS_OK:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ToolError(f"tools.{name}: the host's result is not JSON: {exc}") from None
    if status == STATUS_ERROR:
        raise ToolError(text)
    raise ToolError(f"tools.{name}: refused by the sandbox: {text}", refused=True)


def output(mime: str, data: bytes) -> str | None:
    """Send one output; None once the agent took it, else why it was dropped."""
    if not valid_mime(mime):
        return f"invalid MIME type {mime!r}"
    if len(data) > OUTPUT_MAX:
        return f"{mime} is {len(data)} bytes, over the limit of {OUTPUT_MAX} bytes"
    try:
        status, body = connection().request(LOCAL_OUTPUT, _str(mime.encode()) + data)
    except HostUnreachable as exc:
        return str(exc)
    if status == STATUS_OK:
        return None
    return body.decode("utf-8", "replace") or f"status {status}"
