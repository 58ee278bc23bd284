"""A template image named by a client of `sbx serve` is always a registry source: never a file
or directory of the server's host, whatever that host's working directory holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from exec_sandbox import InputValidationError
from exec_sandbox.server.app import registry_image
from exec_sandbox.templates.oci import skopeo_sources


def test_a_name_that_is_also_a_local_layout_stays_a_registry_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = tmp_path / "alpine"
    layout.mkdir()
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    monkeypatch.chdir(tmp_path)
    # In process, "alpine:3" names the layout's tag 3 here (docs/templates.md)...
    assert skopeo_sources("alpine:3") == [f"oci:{layout}:3"]
    # ...but from a client it is the registry's image.
    assert skopeo_sources(registry_image("alpine:3")) == ["docker://alpine:3"]
    assert registry_image("docker://alpine:3") == "docker://alpine:3"


@pytest.mark.parametrize(
    "image", ["/etc", "./layout", "../x", "~/img.tar", "oci:/srv/layout", "oci-archive:/x.tar", 7]
)
def test_paths_are_refused(image: object) -> None:
    with pytest.raises(InputValidationError, match="no host paths"):
        registry_image(image)
