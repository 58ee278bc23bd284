"""`pip install` inside a running session (and Session.install()), served by the host, in real
VMs without network: the packages come from an index on 127.0.0.1 that the test serves to the
host's pip (tests/package_index.py), never from inside the VM."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from exec_sandbox import PackageNotAllowedError, Scheduler
from tests.helpers import private_config
from tests.package_index import (
    LocalIndex,
    LocalNpmRegistry,
    make_npm_tarball,
    make_sdist,
    make_wheel,
)

pytestmark = pytest.mark.vm
PIP_VERSION = "26.3"  # the real pip a test puts on its index (any release for python 3.11)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalIndex]:
    build = tmp_path / "dists"
    build.mkdir()
    with LocalIndex(tmp_path / "index") as served:
        served.publish(
            make_wheel(build, "six", "1.16.0", {"six.py": "__version__ = '1.16.0'\n"}),
            make_wheel(
                build,
                "sbxdep",
                "2.0.0",
                {"sbxdep/__init__.py": "import six\nVALUE = 'dep ' + six.__version__\n"},
                requires=("six==1.16.0",),
            ),
            make_wheel(build, "sbxother", "1.0.0", {"sbxother.py": "X = 1\n"}),
            make_sdist(build, "sbxsource", "1.0.0"),
        )
        for name, value in served.pip_env().items():
            monkeypatch.setenv(name, value)
        yield served


def _port(index: LocalIndex) -> str:
    return index.url.rsplit(":", 1)[1]


PIP_THEN_IMPORT = """
import subprocess
r = subprocess.run(["pip", "install", "six==1.16.0"], capture_output=True, text=True)
print(r.stdout, r.stderr, "exit", r.returncode)
import six
print("same cell", six.__version__)
"""


async def test_pip_install_in_a_session_imports_in_the_same_repl_and_the_next_exec(
    sched: Scheduler, index: LocalIndex
) -> None:
    async with await sched.session(language="python") as session:
        first = await session.exec(PIP_THEN_IMPORT, timeout_seconds=120)
        assert first.exit_code == 0, first.stderr
        assert "Collecting six==1.16.0" in first.stdout
        assert "Successfully installed six-1.16.0" in first.stdout
        assert "exit 0" in first.stdout
        assert "same cell 1.16.0" in first.stdout
        fetched = index.fetches["six-1.16.0-py3-none-any.whl"]
        # importlib.metadata sees it too (the REPL looks before each request).
        meta = await session.exec("import importlib.metadata as m; print(m.version('six'))")
        assert meta.stdout == "1.16.0\n", meta.stderr
        second = await session.exec("import six, sys; print(six.__file__)")
        assert second.exit_code == 0, second.stderr
        assert "/home/user/.local/lib/python" in second.stdout
        # A new interpreter finds it too (the user site directory is on every python's path).
        third = await session.exec(
            "import subprocess; print(subprocess.run(['python3', '-c', 'import six; "
            "print(six.__version__)'], capture_output=True, text=True).stdout)"
        )
        assert "1.16.0" in third.stdout
        assert session.installed == ("six==1.16.0",)
        # Installed again: satisfied, nothing built or sent.
        again = await session.exec(
            "import subprocess; r = subprocess.run(['python3', '-m', 'pip', 'install', 'six'], "
            "capture_output=True, text=True); print(r.stdout, r.returncode)",
            timeout_seconds=120,
        )
        assert "Requirement already satisfied: six" in again.stdout, again.stdout
        for result in (first, second, third, again):
            assert _port(index) not in result.stdout + result.stderr
        # The host's pip, configured for the test's index, is what fetched it.
        assert fetched >= 1
        # The install is the sandbox's own call, not one of the caller's tools.
        assert first.tool_calls == [] and again.tool_calls == []


REFUSALS = """
import subprocess
for req in ["sbxnothere==1.0.0", "six==9.9.9", "sbxsource==1.0.0"]:
    r = subprocess.run(["pip", "install", req], capture_output=True, text=True)
    print("REQ", req, "exit", r.returncode)
    print(r.stderr)
"""


async def test_pip_install_failures_look_like_pips_and_exit_1(
    sched: Scheduler, index: LocalIndex
) -> None:
    async with await sched.session(language="python") as session:
        result = await session.exec(REFUSALS, timeout_seconds=240)
        assert result.exit_code == 0, result.stderr
        out = result.stdout
        for req in ("sbxnothere==1.0.0", "six==9.9.9", "sbxsource==1.0.0"):
            assert f"REQ {req} exit 1" in out
            assert f"ERROR: No matching distribution found for {req}" in out
        assert "ERROR: Could not find a version that satisfies the requirement sbxnothere" in out
        assert "wheels only" in out
        assert _port(index) not in out
        assert session.installed == ()


async def test_session_install_from_the_host_travels_with_pause_and_fork(
    tmp_path: Path, index: LocalIndex
) -> None:
    async with Scheduler(private_config(tmp_path, max_concurrent_vms=4)) as sched:
        session = await sched.session(language="python")
        report = await session.install(["sbxdep==2.0.0"], timeout_seconds=120)
        assert set(report.packages) == {"sbxdep==2.0.0", "six==1.16.0"}
        imported = await session.exec("import sbxdep; print(sbxdep.VALUE)")
        assert imported.stdout == "dep 1.16.0\n", imported.stderr
        with pytest.raises(PackageNotAllowedError, match="sbxnothere"):
            await session.install(["sbxnothere==1.0.0"], timeout_seconds=120)
        snapshot = await session.pause()
        resumed = await sched.resume(snapshot)
        assert set(resumed.installed) == {"sbxdep==2.0.0", "six==1.16.0"}
        after = await resumed.exec("import sbxdep; print(sbxdep.VALUE)")
        assert after.stdout == "dep 1.16.0\n", after.stderr
        forks = await resumed.fork(2)
        assert isinstance(forks, list)
        try:
            # Each copy installs on its own; the parent's install is in both.
            await forks[0].install(["sbxother==1.0.0"], timeout_seconds=120)
            one = await forks[0].exec("import sbxdep, sbxother; print(sbxother.X)")
            assert one.stdout == "1\n", one.stderr
            two = await forks[1].exec(
                "import sbxdep\ntry:\n    import sbxother\nexcept ImportError:\n    print('absent')"
            )
            assert two.stdout == "absent\n", two.stderr
            assert "sbxother==1.0.0" in forks[0].installed
            assert "sbxother==1.0.0" not in forks[1].installed
        finally:
            for copy in forks:
                await copy.close()
            await resumed.close()
            await sched.delete_snapshot(snapshot)


async def test_installs_can_be_turned_off(tmp_path: Path, index: LocalIndex) -> None:
    async with Scheduler(private_config(tmp_path, allow_guest_installs=False)) as sched:
        async with await sched.session(language="python") as session:
            result = await session.exec(
                "import subprocess; r = subprocess.run(['pip', 'install', 'six==1.16.0'], "
                "capture_output=True, text=True); print(r.stderr, r.returncode)"
            )
            assert "turned off" in result.stdout and result.stdout.rstrip().endswith("1")
            assert index.fetches == {}


async def test_notebook_pip_lines_install_into_the_running_repl(
    sched: Scheduler, index: LocalIndex
) -> None:
    async with await sched.session(language="python") as session:
        result = await session.exec(
            "%pip install six==1.16.0\nimport six\nprint('imported', six.__version__)\n"
            "!pip list 2>/dev/null | grep -c '^six '",
            timeout_seconds=120,
        )
        assert result.exit_code == 0, result.stderr
        assert "Successfully installed six-1.16.0" in result.stdout
        assert "imported 1.16.0" in result.stdout
        assert result.stdout.rstrip().endswith("1")  # `pip list` (a shell line) lists it
        # A failing %pip does not stop the cell, as in a notebook.
        failed = await session.exec("!pip install sbxnothere==1.0.0\nprint('after')")
        assert "ERROR: No matching distribution found for sbxnothere==1.0.0" in failed.stderr
        assert failed.stdout.rstrip().endswith("after")


async def test_install_limits_refuse_with_clear_errors(tmp_path: Path, index: LocalIndex) -> None:
    big = tmp_path / "big"
    big.mkdir()
    index.publish(make_wheel(big, "sbxbig", "1.0.0", {"sbxbig.py": "#" * 1_500_000 + "\n"}))
    config = private_config(tmp_path, guest_installs_max=2, guest_installs_max_mb=1)
    async with Scheduler(config) as sched:
        async with await sched.session(language="python") as session:
            with pytest.raises(PackageNotAllowedError, match="guest_installs_max_mb"):
                await session.install(["sbxbig==1.0.0"], timeout_seconds=120)
            await session.install(["six==1.16.0"], timeout_seconds=120)
            await session.install(["sbxother==1.0.0"], timeout_seconds=120)
            with pytest.raises(PackageNotAllowedError, match="guest_installs_max"):
                await session.install(["sbxdep==2.0.0"], timeout_seconds=120)
            assert session.installed == ("six==1.16.0", "sbxother==1.0.0")
            alive = await session.exec("import six, sbxother; print('ok')")
            assert alive.stdout == "ok\n"


@pytest.fixture
def npm_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalNpmRegistry]:
    build = tmp_path / "npm-dists"
    build.mkdir()
    with LocalNpmRegistry(tmp_path / "registry") as served:
        for name, text in (("sbxjs", "hello from sbxjs"), ("sbxjs2", "second package")):
            tarball = make_npm_tarball(
                build, name, "1.0.0", {"index.js": f"exports.hello = () => {text!r};\n"}
            )
            served.publish(name, {"1.0.0": tarball})
        for name, value in served.npm_env(tmp_path).items():
            monkeypatch.setenv(name, value)
        yield served


NPM = """{
  const r = require('child_process').spawnSync('npm', %s, { encoding: 'utf8' });
  console.log(r.stdout, r.stderr, 'exit', r.status);
}"""


async def test_npm_install_in_a_javascript_session_then_require_and_import(
    sched: Scheduler, npm_registry: LocalNpmRegistry
) -> None:
    async with await sched.session(language="javascript") as session:
        first = await session.exec(NPM % '["install", "sbxjs@1.0.0"]', timeout_seconds=180)
        assert "added 1 package" in first.stdout and "exit 0" in first.stdout, first.stdout
        used = await session.exec("console.log(require('sbxjs').hello())")
        assert used.stdout == "hello from sbxjs\n", used.stderr
        imported = await session.exec(
            "const m = await import('sbxjs'); console.log('import', m.default.hello())"
        )
        assert "import hello from sbxjs" in imported.stdout, imported.stderr
        # A second install keeps the first package (the host rebuilds the whole tree).
        second = await session.exec(NPM % '["i", "sbxjs2"]', timeout_seconds=180)
        assert "exit 0" in second.stdout, second.stdout
        both = await session.exec(
            "console.log(require('sbxjs2').hello(), require('sbxjs').hello())"
        )
        assert both.stdout == "second package hello from sbxjs\n", both.stderr
        assert set(session.installed) == {"sbxjs@1.0.0", "sbxjs2@1.0.0"}
        missing = await session.exec(NPM % '["install", "sbxnothere@1.0.0"]', timeout_seconds=180)
        assert "exit 1" in missing.stdout
        assert "npm error" in missing.stdout and "E404" in missing.stdout, missing.stdout
        assert npm_registry.url.rsplit(":", 1)[1] not in missing.stdout


async def test_session_install_in_a_javascript_session_and_npm_from_python(
    sched: Scheduler, npm_registry: LocalNpmRegistry
) -> None:
    async with await sched.session(language="javascript") as session:
        report = await session.install(["sbxjs@1.0.0"], timeout_seconds=180)
        assert report.packages == ("sbxjs@1.0.0",)
        used = await session.exec("console.log(require('sbxjs').hello())")
        assert used.stdout == "hello from sbxjs\n", used.stderr
    async with await sched.session(language="python") as session:
        result = await session.exec(
            "import subprocess\n"
            "print(subprocess.run(['npm', 'install', 'sbxjs@1.0.0'], capture_output=True, "
            "text=True).stdout)\n"
            "print(subprocess.run(['node', '-e', 'console.log(require(\\'sbxjs\\').hello())'], "
            "capture_output=True, text=True).stdout)",
            timeout_seconds=180,
        )
        assert "added 1 package" in result.stdout, result.stderr
        assert "hello from sbxjs" in result.stdout, result.stdout


REAL_PIP = """
import os, subprocess
env = dict(os.environ, EXEC_SANDBOX_PIP="real", PIP_INDEX_URL="http://index.invalid/simple/",
           PIP_RETRIES="0", PIP_TIMEOUT="2", PIP_DISABLE_PIP_VERSION_CHECK="1")
v = subprocess.run(["pip", "--version"], env=env, capture_output=True, text=True)
print(v.stdout, v.stderr)
r = subprocess.run(["pip", "install", "sbxother==1.0.0"], env=env, capture_output=True, text=True)
print("exit", r.returncode)
print(r.stdout, r.stderr)
d = subprocess.run(["pip", "install", "-U", "pip"], capture_output=True, text=True)
print("default", d.returncode, d.stdout)
"""


async def test_the_real_pip_on_request_runs_pip_itself(
    sched: Scheduler, index: LocalIndex, tmp_path: Path
) -> None:
    # pip's own wheel, from the index the host's pip is configured with, into the test's index
    # (the first use of the real pip gets pip itself from the host, like any package).
    env = {k: v for k, v in os.environ.items() if k not in index.pip_env()}
    wheels = tmp_path / "pip-wheel"
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            f"pip=={PIP_VERSION}",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        pytest.skip(f"pip's wheel is not available to the host: {got.stderr[-300:]}")
    index.publish(*wheels.glob("pip-*.whl"))
    async with await sched.session(language="python") as session:
        result = await session.exec(REAL_PIP, timeout_seconds=240)
        out = result.stdout
        assert result.exit_code == 0, result.stderr
        assert f"pip {PIP_VERSION} from /home/user/.local/share/exec-sandbox/real-pip/pip" in out
        # No network in this session: pip itself fails, as pip does, without the host.
        assert "exit 1" in out
        assert "sbxother==1.0.0" in out and "ERROR:" in out
        assert "sbxother==1.0.0" not in session.installed
        # Without the variable, `pip install -U pip` changes nothing and succeeds.
        assert "default 0 Requirement already satisfied: pip" in out


async def test_an_archive_left_by_an_exec_that_ended_is_unpacked_by_the_next_install(
    sched: Scheduler, index: LocalIndex
) -> None:
    # What the host wrote before the exec that asked ended (its timeout) and so never unpacked:
    # the host counts it as installed, so the guest's next pip puts it in place first.
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        body = b"LEFT = 'over'\n"
        info = tarfile.TarInfo("site-packages/sbxleft.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    async with await sched.session(language="python") as session:
        await session.write_file(".cache/sbx-installs/install-python-left.tar", data.getvalue())
        result = await session.exec(
            "import subprocess; subprocess.run(['pip', 'install', '-q', 'six==1.16.0'])\n"
            "import os, sbxleft, six; print(sbxleft.LEFT, six.__version__, "
            "os.listdir(os.path.expanduser('~/.cache/sbx-installs')))",
            timeout_seconds=120,
        )
        assert result.stdout.strip().endswith("over 1.16.0 []"), result.stderr


KEEP = """
import subprocess
for req in ["sbxdep==2.0.0", "six==1.17.0"]:
    r = subprocess.run(["pip", "install", req], capture_output=True, text=True)
    print("REQ", req, "exit", r.returncode)
    print(r.stdout, r.stderr)
import sbxdep, six
print("uses", sbxdep.VALUE, six.__file__)
"""


async def test_installs_keep_the_versions_the_session_has(
    sched: Scheduler, index: LocalIndex, tmp_path: Path
) -> None:
    newer = tmp_path / "newer"
    newer.mkdir()
    index.publish(make_wheel(newer, "six", "1.17.0", {"six.py": "__version__ = '1.17.0'\n"}))
    async with await sched.session(language="python", packages=["six==1.16.0"]) as session:
        result = await session.exec(KEEP, timeout_seconds=240)
        out = result.stdout
        assert result.exit_code == 0, result.stderr
        # six comes from the session's packages= layer: only sbxdep is added.
        assert "REQ sbxdep==2.0.0 exit 0" in out
        assert "Successfully installed sbxdep-2.0.0\n" in out
        assert "REQ six==1.17.0 exit 1" in out
        assert "six 1.16.0 is installed in this sandbox" in out
        assert "uses dep 1.16.0 /usr/local/lib/python" in out
        assert session.installed == ("six==1.16.0", "sbxdep==2.0.0")


async def test_run_refuses_installs_with_a_pointer_to_packages(
    sched: Scheduler, index: LocalIndex
) -> None:
    result = await sched.run(
        "import subprocess; r = subprocess.run(['pip', 'install', 'six==1.16.0'], "
        "capture_output=True, text=True); print(r.stderr, r.returncode)"
    )
    assert "installs are served in sessions only" in result.stdout
    assert "packages=[...]" in result.stdout and result.stdout.rstrip().endswith("1")
    assert index.fetches == {}


async def test_a_full_work_disk_fails_the_install_like_pip_and_the_session_lives(
    sched: Scheduler, index: LocalIndex, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    big.mkdir()
    index.publish(make_wheel(big, "sbxbig", "1.0.0", {"sbxbig.py": "#" * 1_500_000 + "\n"}))
    async with await sched.session(language="python", disk_mb=64) as session:
        filled = await session.exec(
            "import os\nf = open(os.path.expanduser('~/fill'), 'wb')\n"
            "try:\n    while True:\n        f.write(b'\\0' * (1 << 20)); f.flush()\n"
            "except OSError as e:\n    print('full', e.errno)",
            timeout_seconds=120,
        )
        assert "full 28" in filled.stdout, filled.stderr
        result = await session.exec(
            "import subprocess; r = subprocess.run(['pip', 'install', 'sbxbig==1.0.0'], "
            "capture_output=True, text=True); print(r.stderr, r.returncode)",
            timeout_seconds=120,
        )
        assert "ERROR: Could not install packages due to an OSError" in result.stdout
        assert result.stdout.rstrip().endswith("1")
        assert "sbxbig==1.0.0" not in session.installed
        alive = await session.exec("import os; os.remove(os.path.expanduser('~/fill')); print(1)")
        assert alive.stdout == "1\n"


async def test_a_spawned_process_is_told_to_use_session_install(
    sched: Scheduler, index: LocalIndex
) -> None:
    async with await sched.session(language="python") as session:
        proc = await session.spawn(["pip", "install", "six==1.16.0"])
        assert await proc.wait(timeout=60) == 1
        err = (await proc.stderr.read()).decode()
        assert "use session.install()" in err and "sbx shell" in err
        assert index.fetches == {}


async def test_session_install_in_a_shell_session(sched: Scheduler, index: LocalIndex) -> None:
    async with await sched.session(language="raw") as session:
        report = await session.install(["six==1.16.0"], timeout_seconds=120)
        assert report.packages == ("six==1.16.0",)
        result = await session.exec("python3 -c 'import six; print(six.__version__)'")
        assert result.stdout == "1.16.0\n", result.stderr


async def test_metadata_sees_a_subprocess_install_in_the_next_request(
    sched: Scheduler, index: LocalIndex
) -> None:
    async with await sched.session(language="python") as session:
        await session.exec(
            "import subprocess; subprocess.run(['pip', 'install', '-q', 'six==1.16.0'])",
            timeout_seconds=120,
        )
        meta = await session.exec("import importlib.metadata as m; print(m.version('six'))")
        assert meta.stdout == "1.16.0\n", meta.stderr


REAL_NPM = """
const { spawnSync } = require("child_process");
const env = { ...process.env, EXEC_SANDBOX_NPM: "real",
              npm_config_registry: "http://registry.invalid/", npm_config_fetch_retries: "0",
              npm_config_fetch_timeout: "2000", npm_config_audit: "false",
              npm_config_fund: "false", npm_config_update_notifier: "false" };
const v = spawnSync("npm", ["--version"], { env, encoding: "utf8" });
console.log("version", v.status, v.stdout.trim());
const r = spawnSync("npm", ["install", "left-pad@1.3.0"], { env, encoding: "utf8", cwd: "/tmp" });
console.log("exit", r.status);
console.log(r.stderr);
"""


async def test_the_real_npm_on_request_runs_npm_itself(sched: Scheduler) -> None:
    async with await sched.session(language="javascript") as session:
        result = await session.exec(REAL_NPM, timeout_seconds=120)
        out = result.stdout
        assert result.exit_code == 0, result.stderr
        # npm's own version (the sandbox's npm answers another line), then npm's own failure
        # without network: no host involved, nothing recorded.
        version = out.split("version 0 ", 1)[1].split("\n", 1)[0]
        assert version[:1].isdigit() and version.count(".") == 2, out
        assert "exit 1" in out and "npm error" in out, out
        assert "left-pad@1.3.0" not in session.installed
