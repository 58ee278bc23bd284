/* Bootstraps of the pre-started interpreters (protocol.h, SBX_MSG_PRESTART), passed inline
 * (python3 -c, node -e) so that the root image needs no new file. Each writes "r" to fd 3 (a
 * socket to the agent) once its interpreter has started, then waits there for the go ("1"),
 * then runs the code file (the argument after the inline code, as in
 * `python3 -c BOOTSTRAP /run/sbx/main.py`) as the one-shot run would:
 *   python: like `python3 /run/sbx/main.py`: same sys.argv, sys.path[0], a fresh __main__
 *     namespace, __file__, the traceback of an uncaught exception without the bootstrap's frame,
 *     exit 1 after it (SIGINT re-raised after a KeyboardInterrupt, as the interpreter does);
 *     SystemExit and signals act on the real process.
 *   javascript: like `node /run/sbx/main.js`: the code file is compiled as the main CommonJS
 *     module (require, module, __filename, require.main === module); process.argv is already that
 *     of the script run.
 * A read of anything but "1" (EOF: the agent dropped it) exits quietly. */
#include "bootstrap.h"

const char sbx_bootstrap_python[] =
	"def _run_main():\n"
	"    import os\n"
	"    import sys\n"
	"\n"
	"    os.write(3, b\"r\")\n"
	"    go = os.read(3, 1)\n"
	"    os.close(3)\n"
	"    if go != b\"1\":\n"
	"        os._exit(0)  # discarded before the go (the agent kills it anyway)\n"
	"    path = sys.argv[1]\n"
	"    sys.argv[:] = [path]\n"
	"    sys.path[0] = os.path.dirname(path)\n"
	"    main = sys.modules[\"__main__\"]\n"
	"    namespace = main.__dict__\n"
	"    builtins = namespace[\"__builtins__\"]\n"
	"    namespace.clear()\n"
	"    from importlib.machinery import SourceFileLoader\n"
	"\n"
	"    namespace.update(__name__=\"__main__\", __doc__=None, __package__=None, __spec__=None,\n"
	"                     __annotations__={}, __builtins__=builtins, __file__=path, __cached__=None,\n"
	"                     __loader__=SourceFileLoader(\"__main__\", path))\n"
	"    try:\n"
	"        with open(path, \"rb\") as f:\n"
	"            code = compile(f.read(), path, \"exec\", dont_inherit=True)\n"
	"        del f\n"
	"        exec(code, namespace)\n"
	"    except SystemExit:\n"
	"        raise\n"
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
	"        sys.exit(1)\n"
	"\n"
	"\n"
	"_run_main()\n";

const char sbx_bootstrap_javascript[] =
	"'use strict';\n"
	"(function runMain() {\n"
	"\tconst fs = require('fs');\n"
	"\tconst Module = require('module');\n"
	"\tconst go = Buffer.alloc(1);\n"
	"\tlet n;\n"
	"\tfs.writeSync(3, 'r');\n"
	"\tfor (;;) {\n"
	"\t\ttry {\n"
	"\t\t\tn = fs.readSync(3, go, 0, 1, null);\n"
	"\t\t\tbreak;\n"
	"\t\t} catch (e) {\n"
	"\t\t\tif (e.code !== 'EAGAIN' && e.code !== 'EINTR')\n"
	"\t\t\t\tthrow e;\n"
	"\t\t}\n"
	"\t}\n"
	"\tfs.closeSync(3);\n"
	"\tif (n !== 1 || go[0] !== 0x31)\n"
	"\t\tprocess.exit(0); // discarded before the go (the agent kills it anyway)\n"
	"\tconst path = process.argv[1];\n"
	"\tconst main = new Module(path, null);\n"
	"\tmain.id = '.';\n"
	"\tmain.filename = path;\n"
	"\tmain.paths = Module._nodeModulePaths(require('path').dirname(path));\n"
	"\tModule._cache[path] = main;\n"
	"\tprocess.mainModule = main;\n"
	"\tmain._compile(fs.readFileSync(path, 'utf8'), path);\n"
	"\tmain.loaded = true;\n"
	"})();\n";
