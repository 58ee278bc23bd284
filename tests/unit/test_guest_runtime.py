"""The guest runtime's python side (guest/runtime/python/exec_sandbox_guest: `tools`, `display`,
matplotlib's backend) and the session driver's last expression (guest/repl/driver.py), run on the
host against `HostSocketStandIn`: a STAND-IN for the agent's host socket, a thread that speaks the
local protocol of docs/protocol.md ("Host tools and rich outputs": LOCAL_CALL, LOCAL_OUTPUT,
LOCAL_REPLY) and answers from python functions. It proves the client's framing, ids, threads,
forks and error paths; it checks nothing of what the real agent checks. The guest package is
imported by path, as the image's python imports it from dist-packages."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "guest" / "runtime" / "python"
DRIVER = REPO / "guest" / "repl" / "driver.py"
NODE_DRIVER = REPO / "guest" / "repl" / "driver.js"
NODE_TOOLS = REPO / "guest" / "runtime" / "node" / "tools.js"
NODE = shutil.which("node")

LOCAL_CALL, LOCAL_OUTPUT, LOCAL_REPLY = 1, 2, 3
HEADER = struct.Struct("<IBBHI")


def _load_runtime() -> ModuleType:
    """exec_sandbox_guest from the source tree, under its own name (its submodules import
    relatively)."""
    name = "exec_sandbox_guest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, RUNTIME / name / "__init__.py", submodule_search_locations=[str(RUNTIME / name)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


guest = _load_runtime()
client = importlib.import_module("exec_sandbox_guest._client")


def _recv_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _take_str(payload: bytes, at: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<I", payload, at)
    return payload[at + 4 : at + 4 + length], at + 4 + length


class HostSocketStandIn:
    """STAND-IN for the agent's host socket (see the module's docstring). `tools`: name ->
    function(*args, **kwargs) answering LOCAL_CALL (its JSON result, status 0; an exception:
    status 1 with its message); `refuse_calls` / `refuse_outputs`: a reason answers status 2.
    Each request is answered from a thread of its own, so replies may overtake one another."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tools: dict[str, Callable[..., Any]] = {}
        self.refuse_calls: str | None = None
        self.refuse_outputs: str | None = None
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.outputs: list[tuple[str, bytes]] = []
        self.connections = 0
        self.close_on_call = False
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()
        for conn in self._conns:
            conn.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        send_lock = threading.Lock()

        def reply(rid: int, status: int, body: bytes) -> None:
            payload = bytes((status,)) + struct.pack("<I", len(body)) + body
            with send_lock:
                conn.sendall(HEADER.pack(len(payload), LOCAL_REPLY, 0, 0, rid) + payload)

        while True:
            try:
                header = _recv_exactly(conn, HEADER.size)
            except OSError:
                header = None  # closed by close()
            if header is None:
                return
            length, kind, flags, reserved, rid = HEADER.unpack(header)
            assert (flags, reserved) == (0, 0)
            payload = _recv_exactly(conn, length)
            assert payload is not None
            if kind == LOCAL_CALL:
                name, at = _take_str(payload, 0)
                arguments, at = _take_str(payload, at)
                assert at == len(payload)
                if self.close_on_call:
                    conn.shutdown(socket.SHUT_RDWR)
                    conn.close()
                    return
                threading.Thread(
                    target=self._call, args=(reply, rid, name.decode(), arguments), daemon=True
                ).start()
            elif kind == LOCAL_OUTPUT:
                mime, at = _take_str(payload, 0)
                if self.refuse_outputs is not None:
                    reply(rid, 2, self.refuse_outputs.encode())
                    continue
                with self._lock:
                    self.outputs.append((mime.decode(), payload[at:]))
                reply(rid, 0, b"")
            else:
                raise AssertionError(f"unknown request type {kind}")

    def _call(self, reply: Callable[[int, int, bytes], None], rid: int, name: str, raw: bytes):
        arguments = json.loads(raw)
        with self._lock:
            self.calls.append((name, arguments))
        if self.refuse_calls is not None:
            reply(rid, 2, self.refuse_calls.encode())
            return
        try:
            result = self.tools[name](*arguments["args"], **arguments["kwargs"])
        except Exception as exc:
            reply(rid, 1, str(exc).encode())
            return
        reply(rid, 0, json.dumps(result).encode())


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostSocketStandIn]:
    stand_in = HostSocketStandIn(tmp_path / "host.sock")
    monkeypatch.setenv(client.SOCKET_ENV, str(stand_in.path))
    monkeypatch.setattr(client, "_conn", None)
    yield stand_in
    conn = client._conn
    if conn is not None and conn.sock is not None:
        conn.sock.close()
    stand_in.close()


# --- tools ------------------------------------------------------------------------------------


def test_a_call_sends_args_and_kwargs_and_returns_the_json_result(host: HostSocketStandIn) -> None:
    host.tools["add"] = lambda a, b, scale=1: {"sum": (a + b) * scale}
    assert guest.tools.add(1, 2, scale=10) == {"sum": 30}
    assert guest.call("add", 2, 3) == {"sum": 5}
    assert host.calls == [
        ("add", {"args": [1, 2], "kwargs": {"scale": 10}}),
        ("add", {"args": [2, 3], "kwargs": {}}),
    ]
    assert host.connections == 1  # one connection per process, kept


def test_a_failing_tool_raises_tool_error_with_the_hosts_message(host: HostSocketStandIn) -> None:
    def boom(x: int) -> None:
        raise RuntimeError(f"no luck with {x}")

    host.tools["boom"] = boom
    with pytest.raises(guest.ToolError, match="^no luck with 7$") as caught:
        guest.tools.boom(7)
    assert caught.value.refused is False


def test_a_call_the_agent_refuses_raises_tool_error_with_its_reason(
    host: HostSocketStandIn,
) -> None:
    host.refuse_calls = "no execution running"
    with pytest.raises(guest.ToolError, match="refused by the sandbox: no execution running") as e:
        guest.tools.anything()
    assert e.value.refused is True


def test_arguments_that_are_not_json_or_too_large_are_a_type_error_and_never_sent(
    host: HostSocketStandIn,
) -> None:
    for bad in (object(), {1, 2}, float("nan"), b"bytes", {1: "non-str key is fine"}):
        if isinstance(bad, dict):
            continue  # json turns int keys into strings: allowed
        with pytest.raises(TypeError, match=r"tools\.t: arguments must be JSON-serialisable"):
            guest.tools.t(bad)
    with pytest.raises(TypeError, match="over the limit of 61440 bytes"):
        guest.tools.t("x" * (60 * 1024))
    assert host.calls == []


def test_names_and_the_tools_object() -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        guest.call("not-a-name")
    with pytest.raises(AttributeError):
        guest.tools._private  # noqa: B018
    with pytest.raises(AttributeError):
        guest.tools.__wrapped__  # noqa: B018
    assert "tools.NAME" in repr(guest.tools)
    assert guest.tools.search.__name__ == "search"


def test_calls_from_threads_share_one_connection_and_get_their_own_replies(
    host: HostSocketStandIn,
) -> None:
    # The later calls answer first: each reply must still reach its own caller.
    host.tools["echo"] = lambda i: (time.sleep(0.02 * (8 - i)), i)[1]
    results: dict[int, object] = {}

    def worker(i: int) -> None:
        results[i] = guest.tools.echo(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {i: i for i in range(8)}
    assert host.connections == 1


def test_a_forked_child_opens_its_own_connection(host: HostSocketStandIn) -> None:
    host.tools["pid"] = lambda pid: pid
    assert guest.tools.pid(0) == 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            ok = guest.tools.pid(os.getpid()) == os.getpid()
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.close(r)
    os.waitpid(pid, 0)
    assert guest.tools.pid(1) == 1  # the parent's connection still works
    assert host.connections == 2


def test_a_broken_connection_fails_the_call_and_the_next_call_reconnects(
    host: HostSocketStandIn,
) -> None:
    host.tools["ok"] = lambda: "ok"
    host.close_on_call = True
    with pytest.raises(guest.ToolError, match="the host socket broke"):
        guest.tools.ok()
    host.close_on_call = False
    assert guest.tools.ok() == "ok"
    assert host.connections == 2


def test_without_a_host_socket_a_call_raises_and_display_reports_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(client.SOCKET_ENV, str(tmp_path / "nothing-here.sock"))
    monkeypatch.setattr(client, "_conn", None)
    with pytest.raises(guest.ToolError, match="cannot reach the host socket"):
        guest.tools.x()
    guest.display(1)
    assert capsys.readouterr().err.startswith("exec-sandbox: output dropped: cannot reach")


# --- display ----------------------------------------------------------------------------------


class Html:
    def _repr_html_(self) -> str:
        return "<b>hé</b>"

    def __repr__(self) -> str:
        return "Html()"


class Everything:
    PNG = b"\x89PNG\r\n\x1a\nfake"

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> object:
        return (
            {"text/markdown": "*bundle*", "application/vnd.demo+json": {"a": [1]}},
            {"metadata": "ignored"},
        )

    def _repr_markdown_(self) -> str:
        return "not used: the bundle had text/markdown"

    def _repr_png_(self) -> bytes:
        return self.PNG

    def _repr_jpeg_(self) -> str:
        return "/9j/AA=="  # base64, as IPython's formatters give binary types

    def _repr_json_(self) -> object:
        return {"k": "v"}

    def _repr_latex_(self) -> None:
        return None  # nothing: no output for it

    def _repr_svg_(self) -> str:
        raise ValueError("broken formatter")


def test_display_sends_one_output_per_mime_type_with_text_plain_last(
    host: HostSocketStandIn,
) -> None:
    guest.display(Html(), 42)
    assert host.outputs == [
        ("text/html", "<b>hé</b>".encode()),
        ("text/plain", b"Html()"),
        ("text/plain", b"42"),
    ]


def test_display_merges_the_bundle_and_the_repr_methods(
    host: HostSocketStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    guest.display(Everything())
    outputs = dict(host.outputs)
    assert [mime for mime, _ in host.outputs] == [
        "text/markdown",
        "application/vnd.demo+json",
        "image/png",
        "image/jpeg",
        "application/json",
        "text/plain",
    ]
    assert outputs["text/markdown"] == b"*bundle*"
    assert json.loads(outputs["application/vnd.demo+json"]) == {"a": [1]}
    assert outputs["image/png"] == Everything.PNG
    assert outputs["image/jpeg"] == b"\xff\xd8\xff\x00"
    assert json.loads(outputs["application/json"]) == {"k": "v"}
    assert b".Everything object at 0x" in outputs["text/plain"]
    # The broken formatter is reported, the others still went out.
    assert "_repr_svg_ failed" in capsys.readouterr().err


def test_a_class_displays_as_its_repr_only(host: HostSocketStandIn) -> None:
    guest.display(Html)
    assert host.outputs == [("text/plain", repr(Html).encode())]


def test_outputs_the_agent_refuses_are_one_line_on_stderr_not_an_exception(
    host: HostSocketStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    host.refuse_outputs = "over 32 outputs"
    guest.display(Html())
    assert capsys.readouterr().err == (
        "exec-sandbox: output dropped: over 32 outputs\n"
        "exec-sandbox: output dropped: over 32 outputs\n"
    )


def test_an_invalid_mime_type_from_a_bundle_is_dropped_locally(
    host: HostSocketStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    class Odd:
        def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> object:
            return {"Text/HTML": "x"}

    guest.display(Odd())
    assert [mime for mime, _ in host.outputs] == ["text/plain"]
    assert "output dropped: invalid MIME type 'Text/HTML'" in capsys.readouterr().err


# --- matplotlib -------------------------------------------------------------------------------

# What the clean environment of user code sets (guest/src/spawn.c).
MPLBACKEND = "module://exec_sandbox_guest.mpl_backend"
NO_MATPLOTLIB = "matplotlib is not installed on this host (tests/integration: in the VM)"


def _need_matplotlib() -> None:
    pytest.importorskip("matplotlib", reason=NO_MATPLOTLIB)


@pytest.fixture
def pyplot(host: HostSocketStandIn) -> Iterator[Any]:
    _need_matplotlib()
    import matplotlib

    previous = matplotlib.get_backend()
    import matplotlib.pyplot as plt

    plt.switch_backend(MPLBACKEND)
    yield plt
    plt.close("all")
    plt.switch_backend(previous)


def test_plt_show_sends_every_open_figure_as_png_and_closes_them(
    host: HostSocketStandIn, pyplot: Any
) -> None:
    pyplot.plot([1, 2, 3])
    pyplot.figure()
    pyplot.bar([1, 2], [3, 4])
    pyplot.show()
    assert [mime for mime, _ in host.outputs] == ["image/png", "image/png"]
    assert all(data.startswith(b"\x89PNG\r\n\x1a\n") for _, data in host.outputs)
    assert pyplot.get_fignums() == []


def test_flush_figures_sends_what_is_left_open_and_display_takes_a_figure(
    host: HostSocketStandIn, pyplot: Any
) -> None:
    backend = importlib.import_module("exec_sandbox_guest.mpl_backend")
    fig, ax = pyplot.subplots()
    ax.plot([0, 1])
    guest.display(fig)  # sent now, and no more pyplot's to send
    assert [mime for mime, _ in host.outputs] == ["image/png", "text/plain"]
    assert host.outputs[1][1].startswith(b"<Figure size")
    pyplot.plot([3, 1])
    backend.flush_figures()
    assert [mime for mime, _ in host.outputs][2:] == ["image/png"]
    assert pyplot.get_fignums() == []
    backend.flush_figures()  # nothing open: nothing sent
    assert len(host.outputs) == 3


def test_a_scripts_figures_left_open_are_sent_at_its_end(
    host: HostSocketStandIn, tmp_path: Path
) -> None:
    _need_matplotlib()
    script = tmp_path / "main.py"
    script.write_text("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('done')\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(RUNTIME),
        "MPLBACKEND": MPLBACKEND,
        "EXEC_SANDBOX_HOST_SOCKET": str(host.path),
    }
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")
    assert [mime for mime, _ in host.outputs] == ["image/png"]
    assert host.outputs[0][1].startswith(b"\x89PNG")


# --- the session driver's last expression -----------------------------------------------------


class Driver:
    """A session REPL driver (guest/repl/driver.py, or driver.js with `command`) with the agent's
    side of its protocol played here: the request line on fd 3, the output FIFOs, the completion
    line on fd 4."""

    def __init__(self, tmp_path: Path, socket_path: Path, command: list[str] | None = None) -> None:
        command = command or [sys.executable, "-I", str(DRIVER)]
        self.dir = tmp_path / "run"
        (self.dir / "repl").mkdir(parents=True)
        (self.dir / "session-env").write_bytes(b"")
        req_r, self.req_w = os.pipe()
        self.done_r, done_w = os.pipe()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "EXEC_SANDBOX_HOST_SOCKET": str(socket_path),
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": MPLBACKEND,
        }
        # The agent's fds 3 and 4, placed by a trampoline that then becomes the driver.
        place = (
            "import fcntl, os, sys\n"
            "fds = [fcntl.fcntl(int(fd), fcntl.F_DUPFD_CLOEXEC, 64) for fd in sys.argv[1:3]]\n"
            "os.dup2(fds[0], 3)\n"
            "os.dup2(fds[1], 4)\n"
            "os.execv(sys.argv[3], sys.argv[3:])\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", place, str(req_r), str(done_w), *command],
            pass_fds=(req_r, done_w),
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(req_r)
        os.close(done_w)
        self.seq = 0

    def run(self, code: str) -> tuple[int, str, str]:
        self.seq += 1
        token = f"t{self.seq}"
        fifo = self.dir / "repl" / token
        os.mkfifo(f"{fifo}.out")
        os.mkfifo(f"{fifo}.err")
        out = os.open(f"{fifo}.out", os.O_RDONLY | os.O_NONBLOCK)
        err = os.open(f"{fifo}.err", os.O_RDONLY | os.O_NONBLOCK)
        (self.dir / "session-code").write_text(code)
        os.write(self.req_w, f"{self.seq} {token} nonce{self.seq} {self.dir}\n".encode())
        line = b""
        while line.count(b"\n") < 2:  # "\n<seq> <nonce> <status>\n"
            chunk = os.read(self.done_r, 100)
            assert chunk, "the driver died"
            line += chunk
        seq, nonce, status = line.split(b"\n")[1].split()
        assert (seq, nonce) == (str(self.seq).encode(), f"nonce{self.seq}".encode())
        texts = []
        for fd in (out, err):
            try:
                texts.append(os.read(fd, 1 << 16).decode())
            except BlockingIOError:
                texts.append("")
            os.close(fd)
        return int(status), texts[0], texts[1]

    def close(self) -> None:
        os.close(self.req_w)
        self.proc.wait(10)
        os.close(self.done_r)


@pytest.fixture
def driver(tmp_path: Path, host: HostSocketStandIn) -> Iterator[Driver]:
    d = Driver(tmp_path, host.path)
    yield d
    d.close()


def test_a_sessions_last_expression_is_displayed_not_printed(
    driver: Driver, host: HostSocketStandIn
) -> None:
    assert driver.run("x = 40\nprint('hi')\nx + 2") == (0, "hi\n", "")
    assert host.outputs == [("text/plain", b"42")]
    # None, an assignment, a trailing ";" (comment after it or not): nothing.
    for code in ("None", "y = 1", "print('p')", "x;", "x ;  # quiet", "if x:\n    x"):
        driver.run(code)
    assert host.outputs == [("text/plain", b"42")]
    assert driver.run("class H:\n    def _repr_html_(self): return '<i>h</i>'\nH()")[0] == 0
    assert [mime for mime, _ in host.outputs[1:]] == ["text/html", "text/plain"]
    # The builtins of every python in the VM are there too.
    assert driver.run("display('s'); tools")[0] == 0
    assert host.outputs[3][1] == b"'s'"
    assert host.outputs[4][1].startswith(b"<exec-sandbox host tools")


def _syntax_error(code: str) -> str:
    """What the driver printed for a SyntaxError before it split off last expressions."""
    try:
        compile(code.encode(), "<session>", "exec")
    except SyntaxError as exc:
        return "".join(traceback.format_exception(type(exc), exc, None))
    raise AssertionError("no SyntaxError")


def test_the_drivers_errors_and_tracebacks_are_unchanged(driver: Driver) -> None:
    # From the parser, and from the compiler (which the split would reach with a tree).
    for code in ("x = 1\n1 +", "x = 1\nreturn x", "x = 1\nx\nnonlocal y"):
        status, out, err = driver.run(code)
        assert (status, out, err) == (1, "", _syntax_error(code))
    assert "1 +\n" in _syntax_error("x = 1\n1 +")
    status, _, err = driver.run("def f():\n    raise KeyError('k')\n1\nf()")
    assert status == 1
    assert err == (
        "Traceback (most recent call last):\n"
        '  File "<session>", line 4, in <module>\n'
        '  File "<session>", line 2, in f\n'
        "KeyError: 'k'\n"
    )
    assert driver.run("import sys; sys.exit(3)")[0] == 3
    assert driver.run("x = 5\nx; print(x)") == (0, "5\n", "")  # the state went on


def test_a_sessions_open_figures_are_sent_after_each_exec(
    driver: Driver, host: HostSocketStandIn
) -> None:
    _need_matplotlib()
    assert driver.run("import matplotlib.pyplot as plt\nplt.plot([1, 2]);")[0] == 0
    assert [mime for mime, _ in host.outputs] == ["image/png"]
    assert driver.run("plt.get_fignums()")[0] == 0
    assert host.outputs[1] == ("text/plain", b"[]")


# --- node -------------------------------------------------------------------------------------

needs_node = pytest.mark.skipif(NODE is None, reason="no node on this host")

NODE_CLIENT = """
const { tools } = require(process.argv[1]);
(async () => {
  console.log(JSON.stringify(await Promise.all([tools.add(1, 2), tools.add(3, 4)])));
  for (const call of [() => tools.boom('x'), () => tools.add(1n)]) {
    try { await call(); } catch (e) { console.log(e.name, e.message); }
  }
  console.log(await tools === tools, String(tools).startsWith('[exec-sandbox host tools'));
})();
"""


@needs_node
def test_node_tools_calls_rejections_and_a_process_that_still_ends(
    host: HostSocketStandIn,
) -> None:
    def boom(what: str) -> None:
        raise ValueError(f"no {what}")

    host.tools["add"] = lambda a, b=0: a + b
    host.tools["boom"] = boom
    env = {**os.environ, "EXEC_SANDBOX_HOST_SOCKET": str(host.path)}
    assert NODE is not None
    done = subprocess.run(
        [NODE, "-e", NODE_CLIENT, str(NODE_TOOLS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # the connection, unref'd once idle, must not keep node alive
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[3,7]",
        "ToolError no x",
        "TypeError tools.add: arguments must be JSON-serialisable: Do not know how to "
        "serialize a BigInt",
        "true true",
    ]
    assert host.calls[2] == ("boom", {"args": ["x"], "kwargs": {}})


@needs_node
def test_node_sessions_have_tools_as_a_global(tmp_path: Path, host: HostSocketStandIn) -> None:
    assert NODE is not None
    host.tools["add"] = lambda a, b: a + b
    host.refuse_calls = None
    d = Driver(tmp_path, host.path, [NODE, str(NODE_DRIVER)])
    try:
        status, out, err = d.run("console.log(await tools.add(1, 2))")
        assert (status, out) == (0, "3\n"), err
        host.refuse_calls = "the execution ended"
        status, out, err = d.run(
            "try { await tools.add(1, 2) } catch (e) { console.log(e.name, e.refused, e.message) }"
        )
        assert out == "ToolError true tools.add: refused by the sandbox: the execution ended\n"
        # A name of the code's own replaces the global.
        assert d.run("var tools = 5; console.log(tools)")[1] == "5\n"
    finally:
        d.close()


@needs_node
def test_a_prestarted_node_run_has_tools_as_a_global(
    tmp_path: Path, host: HostSocketStandIn
) -> None:
    # guest/repl/prestart.js as the agent runs it: the ready byte on fd 3, then the go "1".
    assert NODE is not None
    host.tools["add"] = lambda a, b: a + b
    script = tmp_path / "main.js"
    script.write_text(
        "console.log(Object.keys(globalThis).includes('tools'));\n"
        "tools.add(2, 3).then((v) => console.log(v));\n"
    )
    agent, child = socket.socketpair()
    place = "import os, sys\nos.dup2(int(sys.argv[1]), 3)\nos.execv(sys.argv[2], sys.argv[2:])\n"
    prestart = REPO / "guest" / "repl" / "prestart.js"
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", place, str(child.fileno()), NODE, "-r", str(prestart)]
        + [str(script)],
        pass_fds=(child.fileno(),),
        env={**os.environ, "EXEC_SANDBOX_HOST_SOCKET": str(host.path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child.close()
    try:
        assert agent.recv(1) in (b"r", b"n")
        agent.sendall(b"1")
        out, err = proc.communicate(timeout=60)
    finally:
        agent.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out) == (0, "false\n5\n"), err
