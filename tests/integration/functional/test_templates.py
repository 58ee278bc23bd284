"""Templates in real VMs (docs/templates.md): images pulled from a loopback registry, archives
and layouts, build steps on the default image, what the code sees in a template, what a failed
or hostile build leaves, and the speed tiers per template.

The images are busybox-static trees made on the host by tests/templates_support.py; the builds
run in builder VMs. Builds are cached by their inputs in a cache shared by the module's tests
(each test still has its own scheduler), so an image is built once per worker."""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from exec_sandbox import (
    Copy,
    Env,
    InputValidationError,
    Run,
    Scheduler,
    TemplateBuildError,
    TemplateError,
    Workdir,
)
from exec_sandbox.paths import images_dir
from tests.helpers import private_config, qemu_processes
from tests.templates_support import (
    IMAGE_WORKDIR,
    BusyboxImage,
    Registry,
    flip_a_byte,
    layer_blobs,
    make_debian_layout,
    make_hostile_layout,
)

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("templates")


@pytest.fixture
async def sched(tmp_path: Path, shared_cache: Path, images_ready: None) -> AsyncIterator[Scheduler]:
    config = private_config(
        tmp_path,
        template_cache_dir=shared_cache / "templates",
        memory_snapshot_cache_dir=shared_cache / "memory",
        template_build_memory_mb=2048,
    )
    async with Scheduler(config) as scheduler:
        yield scheduler
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"


def _staging_left(cache: Path) -> list[Path]:
    builds = cache / "templates" / "builds"
    return sorted(builds.iterdir()) if builds.is_dir() else []


async def test_a_registry_image_by_tag_and_by_digest_runs_raw_code_in_its_own_tree(
    sched: Scheduler, registry: Registry
) -> None:
    by_tag = await sched.build_template("bb-tag", image=registry.reference)
    assert by_tag.languages.get("raw") == "sh"  # busybox: no bash
    assert "python" not in by_tag.languages
    assert by_tag.workdir == IMAGE_WORKDIR
    assert by_tag.env.get("IMAGE_GREETING") == "hello from the image"
    by_digest = await sched.build_template("bb-digest", image=registry.by_digest)
    assert by_digest.digest == by_tag.digest  # the same manifest: the same template

    code = (
        "busybox | head -n1; pwd; id -u; echo $IMAGE_GREETING; "
        "test -e /usr/sbin/sbx-agent && echo AGENT-VISIBLE; "
        "test -e /usr/bin/python3 && echo DEFAULT-IMAGE-VISIBLE; "
        "echo data > /tmp/x && cat /tmp/x; echo ok"
    )
    result = await sched.run(code, language="raw", template="bb-digest")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("BusyBox")
    assert lines[1:4] == [IMAGE_WORKDIR, "1000", "hello from the image"]
    assert "AGENT-VISIBLE" not in result.stdout
    assert "DEFAULT-IMAGE-VISIBLE" not in result.stdout
    assert lines[-2:] == ["data", "ok"]


async def test_archives_and_layouts_are_sources_and_unchanged_inputs_are_a_cache_hit(
    sched: Scheduler, busybox_image: BusyboxImage
) -> None:
    built = [
        await sched.build_template(name, image=source)
        for name, source in (
            ("bb-layout", busybox_image.layout),
            ("bb-oci", busybox_image.oci_archive),
            ("bb-docker", busybox_image.docker_archive),
        )
    ]
    for template in built:
        result = await sched.run("cat /etc/passwd", language="raw", template=template.name)
        assert result.exit_code == 0, result.stderr
        # The builder gives the image the sandbox user, which user code runs as.
        assert "user:x:1000:1000:" in result.stdout
    again = await sched.build_template("bb-layout", image=busybox_image.layout)
    assert again.digest == built[0].digest
    assert again.build_ms == 0  # a cache hit: nothing built
    names = {t.name for t in await sched.templates()}
    assert {"bb-layout", "bb-oci", "bb-docker"} <= names
    assert await sched.delete_template("bb-oci")
    assert "bb-oci" not in {t.name for t in await sched.templates()}
    assert not await sched.delete_template("bb-oci")


async def test_build_steps_on_the_default_image_give_python_the_files_env_and_workdir(
    sched: Scheduler, tmp_path: Path
) -> None:
    tools = tmp_path / "tools"
    (tools / "sub").mkdir(parents=True)
    (tools / "hello.sh").write_text("#!/bin/sh\necho hello from a copied tool\n")
    (tools / "hello.sh").chmod(0o755)
    (tools / "sub" / "data.txt").write_text("nested\n")
    lines: list[str] = []
    template = await sched.build_template(
        "steps",
        steps=[
            Run("echo built > /etc/built-by-run && echo step output"),
            Copy(tools, "/opt/tools"),
            Env(GREETING="from Env", PATH="/opt/tools:/usr/local/bin:/usr/bin:/bin"),
            Workdir("/srv/app"),
            Run("pwd > where && echo $GREETING > greeting"),
        ],
        memory_mb=256,
        on_progress=lines.append,
    )
    output = "".join(lines)
    assert "step output" in output and "step 5/5" in output
    assert template.languages["python"].startswith("3.")
    assert template.memory_mb == 256
    code = (
        "import os, subprocess\n"
        "print(open('/etc/built-by-run').read().strip())\n"
        "print(subprocess.run(['hello.sh'], capture_output=True, text=True).stdout.strip())\n"
        "print(open('/opt/tools/sub/data.txt').read().strip())\n"
        "print(os.environ['GREETING'], os.getcwd(), open('where').read().strip())\n"
        "print(open('/proc/meminfo').readline().split()[1])\n"
    )
    result = await sched.run(code, language="python", template="steps")
    assert result.exit_code == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[:4] == [
        "built",
        "hello from a copied tool",
        "nested",
        "from Env /srv/app /srv/app",
    ]
    assert 200_000 < int(out[4]) <= 256 * 1024  # the template's memory_mb, in kB


async def test_a_failing_step_raises_with_its_output_and_leaves_nothing(
    sched: Scheduler, shared_cache: Path
) -> None:
    with pytest.raises(TemplateBuildError) as caught:
        await sched.build_template(
            "broken",
            steps=[Run("true"), Run("echo to-stdout; echo to-stderr >&2; exit 3")],
        )
    error = caught.value
    assert error.step == 1 and error.exit_code == 3
    assert "to-stdout" in error.output and "to-stderr" in error.output
    assert "step 2" in str(error)
    assert "broken" not in {t.name for t in await sched.templates()}
    assert _staging_left(shared_cache) == []


async def test_a_tampered_blob_is_refused_before_any_vm(
    sched: Scheduler, busybox_image: BusyboxImage, tmp_path: Path
) -> None:
    import shutil

    layout = tmp_path / "tampered"
    shutil.copytree(busybox_image.layout, layout)
    flip_a_byte(layer_blobs(layout)[0])
    with pytest.raises(TemplateError, match="digest"):
        await sched.build_template("tampered", image=layout)
    assert "tampered" not in {t.name for t in await sched.templates()}


async def test_a_hostile_layer_stays_in_its_tree_and_gives_no_privileges(
    sched: Scheduler, tmp_path: Path
) -> None:
    layout = make_hostile_layout(tmp_path / "hostile")
    try:
        await sched.build_template("hostile", image=layout)
    except TemplateBuildError as exc:
        # umoci may refuse such a layer outright: then nothing was published.
        assert exc.step is None, exc
        assert "hostile" not in {t.name for t in await sched.templates()}
        return
    code = (
        "ls / ; echo ---; cat /etc/link-out 2>&1 | head -n1; echo ---;"
        "/bin/suid-tool 2>&1; echo ---; test -c /dev/evil-mem && echo DEVICE; "
        "cat /dev/evil-mem 2>&1 | head -c 20; echo"
    )
    result = await sched.run(code, language="raw", template="hostile")
    assert result.exit_code == 0, result.stderr
    # Paths climbing out (../x, /x) land inside the tree: the builder VM's own files and the
    # agent's stay as they were (the VM is discarded anyway).
    _listing, link, suid, device = result.stdout.split("---")
    assert "root:" not in link  # the link resolves inside the template, never to the agent's
    assert "uid=1000" in suid and "euid=0" not in suid  # nosuid
    assert "DEVICE" not in device  # the template's /dev is the agent's devtmpfs


async def test_languages_and_names_are_checked_before_any_vm(
    sched: Scheduler, busybox_image: BusyboxImage
) -> None:
    await sched.build_template("bb-layout", image=busybox_image.layout)
    with pytest.raises(InputValidationError, match="no python3"):
        await sched.run("print(1)", language="python", template="bb-layout")
    with pytest.raises(InputValidationError, match="no template named"):
        await sched.run("true", language="raw", template="missing")
    with pytest.raises(InputValidationError, match="packages"):
        await sched.run("1", template="bb-layout", packages=["six==1.16.0"])
    with pytest.raises(InputValidationError, match="template name"):
        await sched.build_template("Bad Name", image=busybox_image.layout)
    with pytest.raises(InputValidationError, match="not both"):
        await sched.build_template("x", image=busybox_image.layout, base="bb-layout")


async def test_a_templates_second_run_restores_its_own_snapshot_and_sessions_travel(
    tmp_path: Path, shared_cache: Path, images_ready: None, busybox_image: BusyboxImage
) -> None:
    config = private_config(
        tmp_path,
        memory_snapshots=True,
        template_cache_dir=shared_cache / "templates",
        template_build_memory_mb=1024,
    )
    async with Scheduler(config) as sched:
        await sched.build_template("bb-layout", image=busybox_image.layout)
        first = await sched.run("cat /etc/hostname; pwd", language="raw", template="bb-layout")
        assert first.exit_code == 0, first.stderr
        assert not first.l1_cache_hit
        assert await sched.wait_snapshots(120)
        second = await sched.run("pwd", language="raw", template="bb-layout")
        assert second.l1_cache_hit and second.stdout.strip() == IMAGE_WORKDIR
        plain = await sched.run("import os; print(os.getcwd())")
        assert plain.stdout.strip() == "/home/user"  # the default image's snapshot is its own

        with pytest.raises(InputValidationError, match="no bash"):
            await sched.session(language="raw", template="bb-layout")


async def test_sessions_of_a_template_pause_resume_and_fork_in_it(sched: Scheduler) -> None:
    await sched.build_template("py", steps=[Workdir("/work"), Run("echo image > /work/made")])
    async with await sched.session(language="python", template="py") as session:
        await session.exec("import os; state = open('made').read().strip() + '+session'")
        paused = await session.pause()
    resumed = await sched.resume(paused.id)
    async with resumed:
        again = await resumed.exec("print(state, os.getcwd())")
        assert again.stdout.split() == ["image+session", "/work"]
        (copy,) = await resumed.fork(1)
        async with copy:
            assert (await copy.exec("print(state)")).stdout == "image+session\n"


async def test_vcpus_come_from_the_template_unless_the_call_says(
    sched: Scheduler, busybox_image: BusyboxImage
) -> None:
    await sched.build_template("bb-2cpu", image=busybox_image.layout, vcpus=2)
    count = "grep -c ^processor /proc/cpuinfo"
    assert (await sched.run(count, language="raw", template="bb-2cpu")).stdout == "2\n"
    assert (await sched.run(count, language="raw", template="bb-2cpu", vcpus=1)).stdout == "1\n"


def test_concurrent_builds_of_one_name_leave_one_template(
    tmp_path: Path, shared_cache: Path, images_ready: None, busybox_image: BusyboxImage
) -> None:
    async def go() -> set[str]:
        config = private_config(
            tmp_path, template_cache_dir=tmp_path / "own", template_build_memory_mb=1024
        )
        async with Scheduler(config) as sched:
            built = await asyncio.gather(
                sched.build_template("same", image=busybox_image.layout),
                sched.build_template("same", image=busybox_image.oci_archive),
            )
            listed = await sched.templates()
            assert [t.name for t in listed] == ["same"]
            return {t.digest for t in built}

    digests = asyncio.run(go())
    assert len(digests) == 1  # the same image through two sources: one template


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[int]:
    """A loopback HTTP server of tmp_path/www (the build's one allowed destination)."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "file").write_text("fetched by a build step\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def test_a_builds_network_reaches_only_its_allowed_domains(
    tmp_path: Path,
    shared_cache: Path,
    images_ready: None,
    busybox_image: BusyboxImage,
    web_server: int,
) -> None:
    config = private_config(
        tmp_path,
        template_cache_dir=shared_cache / "templates",
        template_build_memory_mb=1024,
        network_test_hosts={"web.test:80": f"127.0.0.1:{web_server}"},
    )
    fetch = "busybox wget -q -O /srv/got http://web.test/file"
    async with Scheduler(config) as sched:
        allowed = await sched.build_template(
            "fetched", image=busybox_image.layout, steps=[Run(fetch)], allowed_domains=["web.test"]
        )
        result = await sched.run("cat /srv/got", language="raw", template=allowed.name)
        assert result.stdout == "fetched by a build step\n"
        with pytest.raises(TemplateBuildError) as caught:
            await sched.build_template("unfetched", image=busybox_image.layout, steps=[Run(fetch)])
        assert caught.value.step == 0
        with pytest.raises(TemplateBuildError):
            await sched.build_template(
                "elsewhere",
                image=busybox_image.layout,
                steps=[Run(fetch)],
                allowed_domains=["other.test"],
            )


async def test_a_template_over_its_size_cap_fails_clearly(
    tmp_path: Path, images_ready: None, busybox_image: BusyboxImage
) -> None:
    config = private_config(tmp_path, template_max_mb=16, template_build_memory_mb=1024)
    async with Scheduler(config) as sched:
        with pytest.raises(TemplateBuildError, match="template_max_mb"):
            await sched.build_template(
                "big",
                image=busybox_image.layout,
                steps=[Run("busybox dd if=/dev/zero of=/big bs=1M count=24 2>/dev/null")],
            )
        assert await sched.templates() == []


def test_sbx_template_build_list_run_rm(
    tmp_path: Path, images_ready: None, busybox_image: BusyboxImage
) -> None:
    env = {
        **os.environ,
        "EXEC_SANDBOX_CACHE_DIR": str(tmp_path / "cache"),
        "EXEC_SANDBOX_IMAGES_DIR": str(images_dir()),
    }

    def sbx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "exec_sandbox.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    (tmp_path / "notes.txt").write_text("copied by COPY\n")
    (tmp_path / "hi.sh").write_text("#!/bin/sh\necho hi from a tool\n")
    (tmp_path / "hi.sh").chmod(0o755)
    sandboxfile = tmp_path / "Sandboxfile"
    sandboxfile.write_text(
        f"# a comment\nFROM {busybox_image.layout}\n"
        "ENV GREETING=hi \\\n    OTHER=x\nWORKDIR /app\nCOPY notes.txt /app\n"
        "COPY hi.sh /opt/bin/hi\nENV PATH=/opt/bin:$PATH\n"
        'RUN ["sh", "-c", "echo $GREETING > made"]\n'
    )
    built = sbx("template", "build", "tb", "--file", str(sandboxfile))
    assert built.returncode == 0, built.stderr
    assert built.stdout.startswith("sha256:")
    assert "step 6/6: RUN" in built.stderr  # progress and the steps' output on stderr
    listed = json.loads(sbx("template", "list", "--json").stdout)
    assert [t["name"] for t in listed] == ["tb"] and listed[0]["languages"] == {"raw": "sh"}
    # COPY of a file to a path that is not a directory writes it there; ENV expands $PATH; the
    # code (uid 1000) may write in its working directory.
    code = "pwd; cat made notes.txt; hi; touch mine && echo wrote"
    ran = sbx("run", "--template", "tb", "-l", "raw", "-c", code)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "/app\nhi\ncopied by COPY\nhi from a tool\nwrote\n"
    wrong = sbx("run", "--template", "tb", "-c", "print(1)")
    assert wrong.returncode == 2 and "no python3" in wrong.stderr
    bad = tmp_path / "Bad"
    bad.write_text("FROM default\nEXPOSE 80\n")
    refused = sbx("template", "build", "x", "--file", str(bad))
    assert refused.returncode == 2 and "line 2" in refused.stderr
    assert sbx("template", "rm", "tb").returncode == 0
    assert sbx("template", "rm", "tb").returncode == 1


@pytest.fixture(scope="module")
def debian_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_debian_layout(tmp_path_factory.mktemp("debian") / "layout")


async def test_an_images_own_python_and_node_run_and_restore_from_its_snapshot(
    tmp_path: Path, shared_cache: Path, images_ready: None, debian_layout: Path
) -> None:
    config = private_config(
        tmp_path,
        memory_snapshots=True,
        template_cache_dir=shared_cache / "templates",
        template_build_memory_mb=2048,
    )
    async with Scheduler(config) as sched:
        template = await sched.build_template("debian", image=debian_layout)
        assert template.languages["python"].startswith("3.")
        assert template.languages["javascript"].startswith("v")
        code = "import sys, os; print(sys.executable, os.getuid(), os.getcwd())"
        first = await sched.run(code, template="debian")
        assert first.stdout == "/usr/bin/python3 1000 /home/user\n", first.stderr
        node = await sched.run(
            "console.log(process.version)", language="javascript", template="debian"
        )
        assert node.stdout.strip() == template.languages["javascript"], node.stderr
        async with await sched.session(language="python", template="debian") as session:
            await session.exec("x = 41")
            assert (await session.exec("print(x + 1)")).stdout == "42\n"
            # The guest runtime reaches a template's own python through the session driver.
            shown = await session.exec("x + 1")
            assert [(o.mime_type, o.data) for o in shown.outputs] == [("text/plain", "42")]
        assert await sched.wait_snapshots(180)
        again = await sched.run(code, template="debian")
        assert again.l1_cache_hit and again.stdout == first.stdout


async def test_a_templates_warm_pool_serves_its_runs(
    tmp_path: Path, shared_cache: Path, images_ready: None, busybox_image: BusyboxImage
) -> None:
    templates = shared_cache / "templates"
    async with Scheduler(
        private_config(tmp_path, template_cache_dir=templates, template_build_memory_mb=1024)
    ) as builder:
        await builder.build_template("bb-pool", image=busybox_image.layout)
    # A pool fills from templates that exist: a second scheduler, of the same template cache.
    config = private_config(
        tmp_path / "pooled", template_cache_dir=templates, warm_pool_size={"bb-pool:raw": 1}
    )
    async with Scheduler(config) as sched:
        await sched.wait_pool_ready(timeout=240)
        assert sched.capacity().warm_pool["bb-pool:raw"] == 1
        result = await sched.run("pwd", language="raw", template="bb-pool")
        assert result.warm_pool_hit and result.stdout.strip() == IMAGE_WORKDIR, result.stderr
        plain = await sched.run("pwd", language="raw")
        assert not plain.warm_pool_hit  # the default image has no pool here
    assert qemu_processes(parent=os.getpid()) == [], "a QEMU process outlived its Scheduler"
