"""Container images for the template tests, made on the host from busybox-static: an OCI layout
(packed with umoci), an oci-archive and a docker-archive of it, a loopback registry serving it
(Debian's docker-registry, plain HTTP, marked insecure in a registries.conf of the test's own),
and hand-written layouts (another architecture, a layer of hostile entries) whose bytes the tests
control exactly.

Use the fixtures by importing them into the test module (`from tests.templates_support import
busybox_image  # noqa: F401`). A missing tool skips with its package named; on a machine set up
by `make deps` nothing skips."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BUSYBOX = Path("/bin/busybox")
# What a shell script and the tests' commands need; every one is busybox under another name.
APPLETS = (
    "sh", "ls", "cat", "echo", "env", "id", "pwd", "mkdir", "rm", "cp", "mv", "ln", "test",
    "true", "false", "printf", "stat", "touch", "chmod", "grep", "sed", "head", "wc", "sleep",
    "uname", "whoami",
)  # fmt: skip
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
GROUP = "root:x:0:\nnobody:x:65534:\n"
IMAGE_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE_GREETING=hello from the image")
IMAGE_WORKDIR = "/srv"
TAG = "1"
REPOSITORY = "test/busybox"


def require_tools(*tools: str) -> None:
    """Skip (naming the Debian package) when a tool the fixture runs is missing."""
    packages = {
        "umoci": "umoci",
        "skopeo": "skopeo",
        "docker-registry": "docker-registry",
        "busybox": "busybox-static",
    }
    for tool in tools:
        if tool == "busybox" and _static_busybox() is None:
            pytest.skip("needs a static busybox: apt-get install busybox-static")
        elif tool != "busybox" and shutil.which(tool) is None:
            pytest.skip(f"needs {tool}: apt-get install {packages.get(tool, tool)}")


def _static_busybox() -> Path | None:
    # A dynamic busybox would need the host's libc in the image.
    for candidate in (BUSYBOX, Path("/usr/bin/busybox")):
        if candidate.is_file():
            out = subprocess.run(
                ["file", "-L", str(candidate)], capture_output=True, text=True, check=False
            ).stdout
            if "statically linked" in out or "static-pie" in out:
                return candidate
    return None


def _run(*argv: str | Path) -> str:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} failed: {done.stderr.strip()}")
    return done.stdout


def busybox_tree(root: Path) -> None:
    """A minimal tree: /bin/busybox and its applets, /etc/passwd and /etc/group (no uid 1000: the
    builder adds it), /tmp, /srv."""
    busybox = _static_busybox()
    assert busybox is not None
    for directory in ("bin", "etc", "tmp", "srv", "root"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(GROUP)
    os.chmod(root / "tmp", 0o1777)


def make_busybox_layout(dest: Path, tag: str = TAG) -> Path:
    """An OCI layout at dest holding the busybox tree as one layer, tagged tag, with an image
    config's Env and WorkingDir (what a template built on it starts with)."""
    require_tools("umoci", "busybox")
    work = dest.parent / f".{dest.name}-bundle"
    _run("umoci", "init", "--layout", dest)
    _run("umoci", "new", "--image", f"{dest}:{tag}")
    _run("umoci", "unpack", "--rootless", "--image", f"{dest}:{tag}", work)
    busybox_tree(work / "rootfs")
    _run("umoci", "repack", "--image", f"{dest}:{tag}", work)
    config = ["umoci", "config", "--image", f"{dest}:{tag}", "--config.workingdir", IMAGE_WORKDIR]
    for variable in IMAGE_ENV:
        config += ["--config.env", variable]
    _run(*config)
    # umoci keeps the replaced manifests and configs as unreferenced blobs: gc drops them.
    _run("umoci", "gc", "--layout", dest)
    shutil.rmtree(work)
    return dest


@dataclass(frozen=True)
class BusyboxImage:
    """The same image three ways. layout: an OCI layout directory (tag TAG); oci_archive: a tar
    of that layout; docker_archive: `docker save` format."""

    layout: Path
    oci_archive: Path
    docker_archive: Path
    manifest_digest: str  # of the layout's (OCI) manifest


def make_busybox_image(where: Path) -> BusyboxImage:
    require_tools("umoci", "skopeo", "busybox")
    layout = make_busybox_layout(where / "layout")
    oci_archive = where / "busybox-oci.tar"
    with tarfile.open(oci_archive, "w") as tar:
        for entry in sorted(layout.iterdir()):
            tar.add(entry, arcname=entry.name)
    docker_archive = where / "busybox-docker.tar"
    _run(
        "skopeo",
        "copy",
        "--quiet",
        f"oci:{layout}:{TAG}",
        f"docker-archive:{docker_archive}:{REPOSITORY}:{TAG}",
    )
    index = json.loads((layout / "index.json").read_text())
    return BusyboxImage(layout, oci_archive, docker_archive, index["manifests"][0]["digest"])


@pytest.fixture(scope="session")
def busybox_image(tmp_path_factory: pytest.TempPathFactory) -> BusyboxImage:
    return make_busybox_image(tmp_path_factory.mktemp("busybox-image"))


# --- a loopback registry ---


@dataclass(frozen=True)
class Registry:
    """A docker-registry on 127.0.0.1:port serving REPOSITORY:TAG (the busybox image), marked
    insecure (plain HTTP) in the registries.conf CONTAINERS_REGISTRIES_CONF points to."""

    host: str  # "127.0.0.1:port"
    registries_conf: Path
    manifest_digest: str  # as the registry serves it

    @property
    def reference(self) -> str:
        return f"{self.host}/{REPOSITORY}:{TAG}"

    @property
    def by_digest(self) -> str:
        return f"{self.host}/{REPOSITORY}@{self.manifest_digest}"


def free_port() -> int:
    """A loopback TCP port nothing listens on (right now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for_http(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"docker-registry exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"docker-registry did not answer {url}: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def registry(
    tmp_path_factory: pytest.TempPathFactory, busybox_image: BusyboxImage
) -> Iterator[Registry]:
    require_tools("docker-registry", "skopeo")
    where = tmp_path_factory.mktemp("registry")
    port = free_port()
    host = f"127.0.0.1:{port}"
    (where / "storage").mkdir()
    config = where / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {where / 'storage'}\n"
        f"http:\n  addr: {host}\n"
    )
    conf = where / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{host}"\ninsecure = true\n')
    log = where / "registry.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    saved = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    os.environ["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    try:
        _wait_for_http(f"http://{host}/v2/", process, log)
        _run(
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            f"oci:{busybox_image.layout}:{TAG}",
            f"docker://{host}/{REPOSITORY}:{TAG}",
        )
        digest = _run(
            "skopeo",
            "inspect",
            "--tls-verify=false",
            "--format",
            "{{.Digest}}",
            f"docker://{host}/{REPOSITORY}:{TAG}",
        ).strip()
        yield Registry(host, conf, digest)
    finally:
        if saved is None:
            os.environ.pop("CONTAINERS_REGISTRIES_CONF", None)
        else:
            os.environ["CONTAINERS_REGISTRIES_CONF"] = saved
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- hand-written layouts ---


def _blob(layout: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_layout(
    dest: Path,
    layers: list[bytes],
    *,
    tag: str = TAG,
    architecture: str = "amd64",
    env: tuple[str, ...] = IMAGE_ENV,
    workdir: str = IMAGE_WORKDIR,
) -> Path:
    """An OCI layout at dest from uncompressed tar layers (gzipped here), with a correct
    config (diff_ids), manifest and index: every digest and size right, whatever the layers
    hold."""
    dest.mkdir(parents=True)
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    layer_descriptors = []
    for layer in layers:
        compressed = gzip.compress(layer, mtime=0)
        layer_descriptors.append(
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **_blob(dest, compressed)}
        )
    config = {
        "architecture": architecture,
        "os": "linux",
        "config": {"Env": list(env), "WorkingDir": workdir},
        "rootfs": {
            "type": "layers",
            "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers],
        },
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(dest, json.dumps(config).encode()),
        },
        "layers": layer_descriptors,
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(dest, json.dumps(manifest).encode()),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (dest / "index.json").write_text(json.dumps(index))
    return dest


def tar_of_tree(root: Path) -> bytes:
    """An uncompressed tar layer of a directory (owned by root, as an image's files are)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buffer.getvalue()


# What the hostile layer tries, by entry name: each must end up harmless in the builder VM.
HOSTILE_ENTRIES = {
    "../escaped-by-dotdot": "a path climbing out of the tree",
    "/escaped-absolute": "an absolute path",
    "dev/evil-mem": "a character device (1, 1: /dev/mem)",
    "bin/suid-tool": "a set-uid root file",
    "etc/link-out": "a symlink to a path outside the tree",
    "dir-link": "a symlink to a directory outside the tree, then a file written through it",
    "dir-link/escaped-through-symlink": "the file written through it",
    "hardlink-out": "a hard link to a file outside the tree",
}


def hostile_layer() -> bytes:
    """A tar layer whose entries try to leave the tree or smuggle privileges (HOSTILE_ENTRIES)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:

        def add(info: tarfile.TarInfo, data: bytes = b"") -> None:
            info.uid = info.gid = 0
            info.mtime = 0
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for name in ("../escaped-by-dotdot", "/escaped-absolute"):
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            add(info, b"escaped\n")
        device = tarfile.TarInfo("dev/evil-mem")
        device.type = tarfile.CHRTYPE
        device.devmajor, device.devminor = 1, 1
        device.mode = 0o666
        add(device)
        suid = tarfile.TarInfo("bin/suid-tool")
        suid.mode = 0o4755
        add(suid, b"#!/bin/sh\nid\n")
        link = tarfile.TarInfo("etc/link-out")
        link.type = tarfile.SYMTYPE
        link.linkname = "../../../../../etc/shadow"
        add(link)
        dir_link = tarfile.TarInfo("dir-link")
        dir_link.type = tarfile.SYMTYPE
        dir_link.linkname = "/tmp"
        add(dir_link)
        through = tarfile.TarInfo("dir-link/escaped-through-symlink")
        through.mode = 0o644
        add(through, b"escaped\n")
        hard = tarfile.TarInfo("hardlink-out")
        hard.type = tarfile.LNKTYPE
        hard.linkname = "../../../etc/passwd"
        add(hard)
    return buffer.getvalue()


def make_hostile_layout(dest: Path, *, with_busybox: bool = True) -> Path:
    """An OCI layout (tag TAG) whose last layer is hostile_layer(), on top of the busybox tree
    (with_busybox: so a VM can run a shell in it to look at what became of each entry)."""
    layers = []
    if with_busybox:
        require_tools("busybox")
        tree = dest.parent / f".{dest.name}-tree"
        busybox_tree(tree)
        layers.append(tar_of_tree(tree))
        shutil.rmtree(tree)
    layers.append(hostile_layer())
    return write_layout(dest, layers)


def make_foreign_layout(dest: Path, architecture: str = "arm64") -> Path:
    """The busybox tree in an image whose config says another architecture."""
    require_tools("busybox")
    tree = dest.parent / f".{dest.name}-tree"
    busybox_tree(tree)
    layer = tar_of_tree(tree)
    shutil.rmtree(tree)
    return write_layout(dest, [layer], architecture=architecture)


def layer_blobs(layout: Path, tag: str = TAG) -> list[Path]:
    """The layer blob files of the image tagged tag in layout, in manifest order."""
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    ]
    manifest = json.loads((layout / "blobs" / "sha256" / entry["digest"][7:]).read_text())
    return [layout / "blobs" / "sha256" / layer["digest"][7:] for layer in manifest["layers"]]


def flip_a_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[min(offset, len(data) - 1)] ^= 0x01
    path.write_bytes(bytes(data))


# --- an image with interpreters: the default image's own Debian tree ---


def make_debian_layout(dest: Path, tag: str = TAG) -> Path:
    """An OCI layout (tag tag) of the default image's Debian package tree (python3, node, bash;
    ~300 MB, one gzipped layer of ~110 MB), packed with umoci. The tree is in the images
    directory once `sbx setup` ran."""
    require_tools("umoci")
    from exec_sandbox.images.catalog import load_images
    from exec_sandbox.paths import images_dir

    images = load_images(images_dir())
    trees = sorted(images.rootfs.parent.glob("rootfs-tree-*"), key=lambda p: p.stat().st_mtime)
    assert trees, "no rootfs-tree-* beside the root image: run `sbx setup`"
    bundle = dest.parent / f".{dest.name}-bundle"
    _run("umoci", "init", "--layout", dest)
    _run("umoci", "new", "--image", f"{dest}:{tag}")
    _run("umoci", "unpack", "--image", f"{dest}:{tag}", bundle)
    _run("cp", "-a", f"{trees[-1]}/.", f"{bundle}/rootfs/")
    _run("umoci", "repack", "--image", f"{dest}:{tag}", bundle)
    _run("umoci", "gc", "--layout", dest)
    shutil.rmtree(bundle)
    return dest
