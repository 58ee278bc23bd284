# Session REPL driver for Python, started by sbx-agent as the sandbox user (see guest/src/repl.h).
# fd 3: one line per request from the agent, "<seq> <token> <nonce> <dir>": <dir> holds session-code
# and session-env, <dir>/repl/<token>.out and .err are this request's output FIFOs; fd 4:
# "<seq> <nonce> <status>\n" back once the code has finished, its output is flushed and fds 1 and 2
# are /dev/null again. The nonce is known only from the request line: a thread the code left
# running, writing on fd 4 while this driver holds no FIFO, cannot complete a request. The user's stdout and stderr are the FIFOs the agent streams, so nothing printed
# can pass for a completion, and nothing written after the report reaches any result.
import os
import sys


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
    # Like the interactive interpreter: the working directory, not this file's, is importable.
    sys.path[0] = ""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    me = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def run(source: bytes) -> int:
        # The agent sends SIGINT when the output passes its limit: it interrupts the user's code
        # (KeyboardInterrupt), never the driver between requests.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            # Output is what the code prints, as in run(): no echo of a final expression.
            exec(compile(source, "<session>", "exec"), namespace)
            return 0
        except SystemExit as exc:
            if exc.code is None:
                return 0
            if isinstance(exc.code, int):
                return exc.code & 0xFF
            print(exc.code, file=sys.stderr)
            return 1
        except BaseException:
            # The user's own frames only: the driver's frame is noise.
            etype, value, tb = sys.exc_info()
            if isinstance(value, SyntaxError):
                tb = None  # where in the compiler it was found is of no interest
            elif tb is not None and tb.tb_frame.f_code is run.__code__:
                tb = tb.tb_next
            traceback.print_exception(etype, value, tb)
            return 1
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

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
