/* Bootstraps of the pre-started python and bash (protocol.h, SBX_MSG_PRESTART), passed inline
 * (`python3 -c`, `bash -c`) so that the root image needs no file for them; node's is a preload
 * file, guest/repl/prestart.js, whose header says the same for node. Each writes its ready byte
 * to fd 3 (a socket to the agent) once its interpreter has started, then waits there for the go,
 * then runs the code file (the argument after the inline code, as in
 * `python3 -c BOOTSTRAP /run/sbx/main.py`) as the one-shot run would:
 *   python: like `python3 /run/sbx/main.py`: same sys.argv, sys.path[0], a fresh __main__
 *     namespace, __file__, the traceback of an uncaught exception without the bootstrap's frame,
 *     exit 1 after it (SIGINT re-raised after a KeyboardInterrupt, as the interpreter does);
 *     SystemExit gives the status the interpreter would give; signals act on the real process.
 *   raw: like `bash /run/sbx/main.sh`: `bash -c BOOTSTRAP /run/sbx/main.sh` sources the file, so
 *     $0, $#, BASH_SOURCE, LINENO and error messages are those of the script run; what differs:
 *     "c" in $-, "source" for "main" at the bottom of FUNCNAME, and a top-level `return` that is
 *     allowed. The report socket moves from fd 3 (scripts use `exec 3>file`) to fd 63.
 * The ready byte is "r", or "n" from a process that holds generator state it cannot refresh
 * (runner.h, struct sbx_prestarted): bash, for $RANDOM. The go is "1", or "2" when a RESEED came
 * while it waited (it was parked in a template and this is a clone): python has nothing to
 * refresh (its code imports `random` and asks the kernel after the go). A read of anything else
 * (EOF: the agent dropped it) exits quietly.
 *
 * When the code has ended as a script would, each reports it on fd 3 ("d" + the exit status byte,
 * runner.h) before the interpreter's own teardown, which the result need not wait for:
 *   python: after what the interpreter does first when a script ends, in its order (join the
 *     non-daemon threads, run the atexit callbacks, flush stdout and stderr), then os._exit();
 *   raw: when the sourced file returns (an `exit` in it, or `set -e`, ends the shell first: no
 *     report, the usual way).
 * A process killed by a signal or by os._exit() reports nothing; the agent then waits for its death.
 * Each does, before its ready, what the code's run would otherwise pay for the first time in the
 * process: python imports importlib.machinery (~50 ms under TCG), compiles once and touches
 * stdout; bash runs once each builtin and redirection its part after the go uses (source, test,
 * exec, printf -v: 16 -> 10.7 ms). */
#include "bootstrap.h"

const char sbx_bootstrap_python[] =
	"def _run_main():\n"
	"    import atexit\n"
	"    import os\n"
	"    import sys\n"
	"    from importlib.machinery import SourceFileLoader  # ~50 ms under TCG: before the \"r\"\n"
	"\n"
	"    # The script's process as `python3 PATH` would have it, all known before the code is.\n"
	"    os.set_inheritable(3, False)\n"
	"    path = sys.argv[1]\n"
	"    sys.argv[:] = [path]\n"
	"    sys.path[0] = os.path.dirname(path)\n"
	"    main = sys.modules[\"__main__\"]\n"
	"    namespace = main.__dict__\n"
	"    builtins = namespace[\"__builtins__\"]\n"
	"    namespace.clear()\n"
	"    namespace.update(__name__=\"__main__\", __doc__=None, __package__=None, __spec__=None,\n"
	"                     __annotations__={}, __builtins__=builtins, __file__=path, __cached__=None,\n"
	"                     __loader__=SourceFileLoader(\"__main__\", path))\n"
	"    status = 0\n"
	"    # The process's first compile and first write to stdout allocate (fresh pages: guest page\n"
	"    # faults, dear under TCG); done before the ready, the code's reuse that memory (pool hit\n"
	"    # p50 6.7 -> 6.3 ms in an A/B run, docs/benchmarks.md).\n"
	"    compile(b\"print(1)\\n\", path, \"exec\", dont_inherit=True)\n"
	"    sys.stdout.write(\"\")\n"
	"\n"
	"    os.write(3, b\"r\")\n"
	"    go = os.read(3, 1)\n"
	"    if go not in (b\"1\", b\"2\"):  # \"2\": nothing to refresh (the header above)\n"
	"        os._exit(0)  # discarded before the go (the agent kills it anyway)\n"
	"    try:\n"
	"        with open(path, \"rb\", buffering=0) as f:  # one read, no buffer object\n"
	"            code = compile(f.readall(), path, \"exec\", dont_inherit=True)\n"
	"        del f\n"
	"        exec(code, namespace)\n"
	"    except SystemExit as exc:\n"
	"        # What the interpreter makes of SystemExit: None is 0, an int is the status, anything\n"
	"        # else is printed and gives 1.\n"
	"        if exc.code is None:\n"
	"            pass\n"
	"        elif isinstance(exc.code, int):\n"
	"            status = exc.code if -(1 << 63) <= exc.code < (1 << 63) else -1\n"
	"        else:\n"
	"            try:\n"
	"                print(exc.code, file=sys.stderr)\n"
	"            except Exception:\n"
	"                pass\n"
	"            status = 1\n"
	"    except BaseException as exc:\n"
	"        # What the interpreter does with an uncaught exception, minus this frame (the\n"
	"        # hook prints the exception's own __traceback__, so that is the one to cut).\n"
	"        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None\n"
	"        sys.excepthook(type(exc), exc.with_traceback(tb), tb)\n"
	"        if isinstance(exc, KeyboardInterrupt):\n"
	"            import signal\n"
	"\n"
	"            signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
	"            os.kill(os.getpid(), signal.SIGINT)\n"
	"        status = 1\n"
	"    try:\n"
	"        threading = sys.modules.get(\"threading\")\n"
	"        if threading is not None:\n"
	"            threading._shutdown()\n"
	"        atexit._run_exitfuncs()\n"
	"    except BaseException:\n"
	"        pass\n"
	"    for stream in (sys.stdout, sys.stderr):\n"
	"        try:\n"
	"            stream.flush()\n"
	"        except Exception:\n"
	"            status = 120\n"
	"    try:\n"
	"        os.write(3, bytes((0x64, status & 0xFF)))\n"
	"    except OSError:\n"
	"        pass  # the code closed fd 3: the agent waits for the exit instead\n"
	"    os._exit(status & 0xFF)\n"
	"\n"
	"\n"
	"# Run with globals of its own: the script's namespace is __main__'s, and a script that defines\n"
	"# print, bytes or isinstance at its top level must not change what the bootstrap calls.\n"
	"type(_run_main)(_run_main.__code__, {\"__builtins__\": __builtins__})()\n";

const char sbx_bootstrap_raw[] =
	"# Before the ready: each builtin and redirection used after the go, once, on a dummy.\n"
	"_sbx_x=0\n"
	"[ \"$_sbx_x\" = 1 ]\n"
	"exec 62>&3 62>&-\n"
	". /dev/null\n"
	"printf -v _sbx_x %02x 0\n"
	"unset _sbx_x\n"
	"printf n >&3 # $RANDOM was seeded at the start: a RESEED must kill it\n"
	"IFS= read -r -n 1 -u 3 _sbx_go || exit 0\n"
	"[ \"$_sbx_go\" = 1 ] || exit 0\n"
	"unset _sbx_go BASH_EXECUTION_STRING\n"
	"exec 63>&3 3>&-\n"
	". \"$0\"\n"
	"_sbx_status=$?\n"
	"printf -v _sbx_status_hex %02x \"$_sbx_status\"\n"
	"printf \"d\\\\x$_sbx_status_hex\" >&63 2>/dev/null\n"
	"exit \"$_sbx_status\"\n";
