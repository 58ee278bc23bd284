# Session REPL driver for Python, started by sbx-agent as the sandbox user (see guest/src/repl.h).
# fd 3: one line per request from the agent, "<seq> <token> <nonce> <dir>": <dir> holds session-code
# and session-env, <dir>/repl/<token>.out and .err are this request's output FIFOs; fd 4:
# "<seq> <nonce> <status>\n" back once the code has finished, its output is flushed and fds 1 and 2
# are /dev/null again. The nonce is known only from the request line: a thread the code left
# running, writing on fd 4 while this driver holds no FIFO, cannot complete a request. The user's stdout and stderr are the FIFOs the agent streams, so nothing printed
# can pass for a completion, and nothing written after the report reaches any result.
# As in a notebook, a last statement that is an expression has its value (unless None, or the
# statement ends with ";") sent to the host with display() as rich outputs, not printed; figures
# matplotlib's sandbox backend holds open are sent after each request (guest/runtime/python).
import os
import sys


def _runtime():
    """The guest runtime (guest/runtime/python: display(), matplotlib's flush), or None. In the
    image it is already imported (its .pth file) and its builtins are in place. A template's own
    python has no .pth of it: it is beside this file, in python/ (the image's /usr/lib/sbx, which
    a template VM binds into its root); the agent's host tests run this file from the source
    tree, where the runtime sits beside guest/repl/."""
    try:
        import exec_sandbox_guest
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        for where in (
            os.path.join(here, "python"),
            os.path.join(os.path.dirname(here), "runtime", "python"),
        ):
            sys.path.insert(0, where)
            try:
                import exec_sandbox_guest

                break
            except ImportError:
                pass
            finally:
                del sys.path[0]
        else:
            return None
    exec_sandbox_guest._install_builtins()
    return exec_sandbox_guest


def _compile_parts(source: bytes):
    """(code of the statements, code of the last expression or None): the source's last
    statement, when it is an expression not followed by ";", is split off to be evaluated.
    Errors are exactly those of compile(source): a SyntaxError the compiler raises for the tree
    (e.g. 'return' outside function) comes from compiling the source again."""
    import _ast

    tree = compile(source, "<session>", "exec", _ast.PyCF_ONLY_AST)
    last = tree.body[-1] if tree.body else None
    if isinstance(last, _ast.Expr):
        rest = b"".join(source.splitlines(keepends=True)[last.end_lineno - 1 :])
        if rest[last.end_col_offset :].lstrip().startswith(b";"):
            last = None  # "value;" shows nothing, as in IPython
    try:
        if not isinstance(last, _ast.Expr):
            return compile(tree, "<session>", "exec"), None
        body = _ast.Module(body=tree.body[:-1], type_ignores=tree.type_ignores)
        return (
            compile(body, "<session>", "exec"),
            compile(_ast.Expression(body=last.value), "<session>", "eval"),
        )
    except SyntaxError:
        pass
    # Outside the handler: the error must not carry the first one as its context.
    return compile(source, "<session>", "exec"), None


def _shell_lines(source: bytes):
    """Notebook lines in a cell that is not valid python: `%pip ...`/`!pip ...` become a call
    of the sandbox's pip in this interpreter (what it installs imports at once), other `!cmd`
    lines (and pip in a pipeline) a shell command. One line for one line: line numbers hold. None when the cell has
    no such line (its SyntaxError stands)."""
    import re

    lines = source.decode("utf-8", "replace").splitlines(keepends=True)
    changed = False
    for i, line in enumerate(lines):
        match = re.match(r"(\s*)([!%])(.*?)(\r?\n)?$", line)
        if match is None:
            continue
        indent, mark, command, end = match[1], match[2], match[3].strip(), match[4] or ""
        words = command.split(None, 1)
        # `!pip ... | grep x` is a shell pipeline: only a plain pip line runs in-process.
        plain = mark == "%" or not re.search(r"[|&;<>`$()]", command)
        if words and words[0] in ("pip", "pip3") and plain:
            call = '__import__("exec_sandbox_guest._install", fromlist=["magic"]).magic(%r)'
            lines[i] = indent + call % (words[1] if len(words) > 1 else "") + end
        elif mark == "!" and command:
            lines[i] = indent + '__import__("subprocess").run(%r, shell=True)' % command + end
        else:
            continue
        changed = True
    return "".join(lines).encode() if changed else None


def _main() -> None:
    import io
    import signal
    import traceback

    control_in = os.fdopen(os.dup(3), "rb", buffering=0)
    control_out = os.dup(4)
    for fd in (3, 4):
        os.close(fd)
    os.set_inheritable(control_in.fileno(), False)
    os.set_inheritable(control_out, False)
    # Unbuffered below the text layer: a fork() in user code cannot duplicate pending output.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    runtime = _runtime()  # before the working directory is on sys.path: nothing there shadows it
    installed = getattr(runtime, "_InstalledFinder", None)
    # Like the interactive interpreter: the working directory, not this file's, is importable.
    sys.path[0] = ""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    me = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def flush_figures() -> None:
        # Only once the code loaded the sandbox's matplotlib backend (never imported here), and
        # not in a fork of the code that came back through run().
        backend = sys.modules.get("exec_sandbox_guest.mpl_backend")
        if backend is not None and os.getpid() == me:
            try:
                backend.flush_figures()
            except BaseException:
                pass  # an interrupt (the output limit) while sending: the figures are lost

    # Frames of the driver a traceback starts with, cut from it.
    driver_frames = {_compile_parts.__code__}

    def run(source: bytes) -> int:
        # The agent sends SIGINT when the output passes its limit: it interrupts the user's code
        # (KeyboardInterrupt), never the driver between requests.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if installed is not None:
            try:
                installed.refresh()  # packages a subprocess's pip added: one stat()
            except Exception:
                pass
        try:
            try:
                body, last = _compile_parts(source)
            except SyntaxError:
                rewritten = _shell_lines(source)
                if rewritten is None:
                    raise
                body, last = _compile_parts(rewritten)
            exec(body, namespace)
            if last is not None:
                value = eval(last, namespace)
                if value is not None and runtime is not None:
                    runtime.display(value)
            return 0
        except SystemExit as exc:
            if exc.code is None:
                return 0
            if isinstance(exc.code, int):
                return exc.code & 0xFF
            print(exc.code, file=sys.stderr)
            return 1
        except BaseException:
            # The user's own frames only: the driver's frames are noise.
            etype, value, tb = sys.exc_info()
            if isinstance(value, SyntaxError):
                tb = None  # where in the compiler it was found is of no interest
            else:
                while tb is not None and tb.tb_frame.f_code in driver_frames:
                    tb = tb.tb_next
            traceback.print_exception(etype, value, tb)
            return 1
        finally:
            flush_figures()
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    driver_frames.add(run.__code__)

    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)

    def install(out: int, err: int) -> None:
        os.dup2(out, 1)
        os.dup2(err, 2)

    def release(fifo: str) -> None:
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}") in (fifo + ".out", fifo + ".err"):
                    os.dup2(devnull, int(name))
            except OSError:
                pass

    while True:
        line = control_in.readline()
        if not line:
            os._exit(0)
        seq, token, nonce, run_dir = os.fsdecode(line.rstrip(b"\n")).split(" ", 3)
        report = b"\n%s %s " % (seq.encode(), nonce.encode())
        fifo = os.path.join(run_dir, "repl", token)
        try:
            out = os.open(fifo + ".out", os.O_WRONLY | os.O_CLOEXEC)
            err = os.open(fifo + ".err", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            # The request is already over (its FIFOs are gone): nobody waits for it.
            continue
        install(out, err)
        os.close(out)
        os.close(err)
        code_path = os.path.join(run_dir, "session-code")
        env_path = os.path.join(run_dir, "session-env")
        try:
            with open(env_path, "rb") as f:
                for record in f.read().split(b"\0"):
                    name, sep, value = record.partition(b"=")
                    if sep:
                        os.environb[name] = value
            with open(code_path, "rb") as f:
                source = f.read()
        except OSError as exc:
            print(f"session driver: {exc}", file=sys.stderr)
            install(devnull, devnull)
            release(fifo)
            os.write(control_out, report + b"1\n")
            continue
        status = run(source)
        if os.getpid() != me:
            # A fork() of the user's code came back here: it must not act as the REPL.
            os._exit(status)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        # The agent believes the report only once no fd of this process is on its FIFOs: copies
        # the code kept (os.dup(1)) write to /dev/null from now on.
        install(devnull, devnull)
        release(fifo)
        os.write(control_out, report + b"%d\n" % status)


_main()
