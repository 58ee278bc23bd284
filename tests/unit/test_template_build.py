"""The host's side of a template build that touches what the builder VM (hostile) reported or
wrote, and what the host copies in: the finish report's checks, the sealed image, Copy sources,
and the once-per-process check of a published image. No VM."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from exec_sandbox import Copy, InputValidationError, Template, TemplateError
from exec_sandbox.templates.build import _finish_facts, _seal, _stage_copies
from exec_sandbox.templates.store import TemplateStore

MAX = 1 << 30


def report(**fields: object) -> str:
    base: dict[str, object] = {
        "size": 8192,
        "languages": {"python": "3.12.1", "raw": "bash"},
        "env": {"PATH": "/usr/bin:/bin"},
        "workdir": "/srv",
    }
    base.update(fields)
    return "some output of mkfs\n" + json.dumps(base) + "\n"


def test_a_good_report_gives_the_facts() -> None:
    facts = _finish_facts(report(), MAX)
    assert facts.size == 8192 and facts.workdir == "/srv"
    assert facts.languages == {"python": "3.12.1", "raw": "bash"}
    assert facts.env == {"PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize(
    "fields",
    [
        {"size": MAX + 1},
        {"size": 0},
        {"size": True},
        {"size": "8192"},
        {"languages": {"python": "3.12\n1"}},
        {"languages": {"python": "x" * 65}},
        {"languages": ["python"]},
        {"env": {"BAD NAME": "x"}},
        {"env": {"A": 1}},
        {"env": {"A": "a\x00b"}},
        {"env": {f"V{i}": "x" for i in range(101)}},
        {"workdir": "relative"},
        {"workdir": "/a\nb"},
    ],
)
def test_a_bad_report_is_a_template_error(fields: dict[str, object]) -> None:
    with pytest.raises(TemplateError):
        _finish_facts(report(**fields), MAX)


def test_a_report_nested_deep_enough_to_blow_the_parser_is_a_template_error() -> None:
    with pytest.raises(TemplateError):
        _finish_facts("[" * 100_000 + "]" * 100_000, MAX)
    with pytest.raises(TemplateError):
        _finish_facts("", MAX)


def test_the_sealed_image_is_a_read_only_copy_of_the_reported_bytes(tmp_path: Path) -> None:
    output = tmp_path / "output.raw"
    data = os.urandom(10_000)
    output.write_bytes(data + b"\0" * 50_000)  # the disk is larger than the image on it
    image = tmp_path / "image.erofs"
    digest = _seal(output, image, len(data))
    assert image.read_bytes() == data
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert stat.S_IMODE(image.stat().st_mode) == 0o444
    assert not output.exists()
    short = tmp_path / "short.raw"
    short.write_bytes(b"x" * 10)
    with pytest.raises(TemplateError, match="shorter"):
        _seal(short, tmp_path / "other.erofs", 100)


def test_copy_sources_keep_links_and_refuse_devices_and_fifos(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "file").write_text("data")
    (source / "link").symlink_to("/etc/passwd")
    into = tmp_path / "staged"
    hashes = _stage_copies((Copy(source, "/opt"),), into)
    assert (into / "0" / "file").read_text() == "data"
    assert os.readlink(into / "0" / "link") == "/etc/passwd"  # copied as a link, not followed
    assert set(hashes) == {0}
    os.mkfifo(source / "fifo")
    with pytest.raises(InputValidationError, match="fifo"):
        _stage_copies((Copy(source, "/opt"),), tmp_path / "again")


def test_a_published_image_is_checked_once_per_process(tmp_path: Path) -> None:
    async def go() -> None:
        store = TemplateStore(tmp_path / "cache", max_bytes=MAX)
        async with store.build_dir() as staging:
            image = staging / "image.erofs"
            data = b"an image" * 1000
            image.write_bytes(data)
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            template = Template(
                name="t", digest=digest, size_bytes=len(data), languages={"raw": "sh"},
                env={}, workdir="/",
            )  # fmt: skip
            await store.publish(template, image)
        path = await store.verified(digest)
        assert path.read_bytes() == data
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
        os.chmod(path, 0o644)
        path.write_bytes(b"An image" + data[8:])  # same size, other bytes
        assert await store.verified(digest) == path  # checked once per process already
        fresh = TemplateStore(tmp_path / "cache", max_bytes=MAX)
        with pytest.raises(TemplateError, match="damaged"):
            await fresh.verified(digest)

    asyncio.run(go())
