"""A Python package index and an npm registry served on 127.0.0.1 from packages the tests make
themselves, so that package tests are deterministic and need no network. Each counts the
requests for package files, to prove what a build fetched."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import tarfile
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    files: Mapping[str, str],
    *,
    tag: str = "py3-none-any",
    requires: tuple[str, ...] = (),
    scripts: Mapping[str, str] | None = None,
) -> Path:
    """A minimal valid wheel: the files, METADATA, WHEEL, entry points, RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-{tag}.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = dict(files)
    entries[f"{dist}.dist-info/METADATA"] = meta
    entries[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: sbx-tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    )
    if scripts:
        entries[f"{dist}.dist-info/entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items()
        )
    record = []
    for arcname, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{arcname},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    entries[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, text in entries.items():
            zf.writestr(arcname, text)
    return path


def make_sdist(directory: Path, name: str, version: str) -> Path:
    path = directory / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        data = b"from setuptools import setup\nsetup()\n"
        info = tarfile.TarInfo(f"{name}-{version}/setup.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return path


def make_npm_tarball(directory: Path, name: str, version: str, files: Mapping[str, str]) -> Path:
    path = directory / f"{name}-{version}.tgz"
    entries = {
        "package/package.json": json.dumps({"name": name, "version": version, "main": "index.js"})
    }
    entries.update({f"package/{k}": v for k, v in files.items()})
    with tarfile.open(path, "w:gz") as tf:
        for arcname, text in entries.items():
            data = text.encode()
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return path


class _Server:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.fetches: Counter[str] = Counter()  # file name -> GETs
        served = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                super().__init__(*args, directory=str(served.root), **kwargs)

            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                if name.endswith((".whl", ".tar.gz", ".tgz")):
                    served.fetches[name] += 1
                self.path = served.rewrite(self.path)
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def rewrite(self, path: str) -> str:
        return path

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class LocalIndex(_Server):
    """A PEP 503 simple index of the files in root/files."""

    def publish(self, *files: Path) -> None:
        (self.root / "files").mkdir(exist_ok=True)
        for f in files:
            f.rename(self.root / "files" / f.name)
        projects: dict[str, list[Path]] = {}
        for f in (self.root / "files").iterdir():
            project = f.name.split("-", 1)[0].replace("_", "-").lower()
            projects.setdefault(project, []).append(f)
        for project, dists in projects.items():
            page = self.root / "simple" / project
            page.mkdir(parents=True, exist_ok=True)
            links = "".join(
                f'<a href="../../files/{d.name}#sha256={hashlib.sha256(d.read_bytes()).hexdigest()}">'  # noqa: E501
                f"{d.name}</a>\n"
                for d in sorted(dists)
            )
            (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")

    def pip_env(self) -> dict[str, str]:
        """Environment that points the host's pip at this index only (config files ignored,
        no cache, so every build's fetches are counted)."""
        return {
            "PIP_CONFIG_FILE": "/dev/null",
            "PIP_INDEX_URL": f"{self.url}/simple/",
            "PIP_NO_CACHE_DIR": "1",
            "PIP_FIND_LINKS": "",
            "PIP_EXTRA_INDEX_URL": "",
            "PIP_RETRIES": "0",
            "PIP_TIMEOUT": "5",
        }


class LocalNpmRegistry(_Server):
    """Package documents at /<name>, tarballs at /<name>/-/<file>."""

    def publish(self, name: str, versions: Mapping[str, Path]) -> None:
        doc: dict[str, object] = {"name": name, "versions": {}, "dist-tags": {}}
        for version, tarball in versions.items():
            target = self.root / name / "-" / tarball.name
            target.parent.mkdir(parents=True, exist_ok=True)
            data = tarball.read_bytes()
            target.write_bytes(data)
            integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
            doc["versions"][version] = {  # type: ignore[index]
                "name": name,
                "version": version,
                "dist": {
                    "tarball": f"{self.url}/{name}/-/{tarball.name}",
                    "shasum": hashlib.sha1(data).hexdigest(),
                    "integrity": integrity,
                },
            }
            doc["dist-tags"] = {"latest": version}
        # Served as a file named like the package: the directory of the same name holds tarballs.
        (self.root / name / "index.json").write_text(json.dumps(doc))

    def rewrite(self, path: str) -> str:
        return path if "/-/" in path else path.split("?")[0].rstrip("/") + "/index.json"

    def npm_env(self, home: Path) -> dict[str, str]:
        rc = home / "npmrc"
        rc.write_text("")
        return {"npm_config_registry": f"{self.url}/", "npm_config_userconfig": str(rc)}


@contextmanager
def serve_index(root: Path) -> Iterator[LocalIndex]:
    with LocalIndex(root) as index:
        yield index
