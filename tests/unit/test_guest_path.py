"""Lexical validation of session file paths (files.guest_path): runs before anything is sent."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from exec_sandbox import InputValidationError
from exec_sandbox.vm.file_transfer import guest_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a.txt", b"a.txt"),
        ("./dir//b.txt", b"dir/b.txt"),
        ("/home/user/x/y", b"x/y"),
        ("dir/", b"dir"),
        (PurePosixPath("p/q"), b"p/q"),
        ("ünï.txt", "ünï.txt".encode()),
        ("n" * 255, b"n" * 255),
    ],
)
def test_accepted_paths_become_relative_to_home(path: object, expected: bytes) -> None:
    assert guest_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../x",
        "a/../b",
        "a/..",
        "/etc/passwd",
        "/home/username/x",
        "/home/user/../root",
        "x\x00y",
        "n" * 256,
        "d/" + "n" * 256,
        "a/" * 2100,
        "",
        "/home/user",
        ".",
        42,
        b"bytes",
    ],
)
def test_refused_paths_raise_input_validation_error(path: object) -> None:
    with pytest.raises(InputValidationError):
        guest_path(path)


def test_listing_may_name_the_home_itself() -> None:
    assert guest_path("", allow_empty=True) == b""
    assert guest_path("/home/user/", allow_empty=True) == b""
    with pytest.raises(InputValidationError):
        guest_path("../", allow_empty=True)
