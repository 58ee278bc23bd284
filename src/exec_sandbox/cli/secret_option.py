"""`--secret NAME=ENVVAR@HOST[,HOST...]` of `sbx run` and `sbx shell` (docs/design.md,
"Secrets")."""

from __future__ import annotations

from collections.abc import Mapping

from ..network.secrets import Secret


def parse_secret(spec: str, environ: Mapping[str, str]) -> Secret:
    """The guest's NAME holds a placeholder, the host puts the value of its own ENVVAR in
    requests to HOST. The value is never an argument (argv is readable by every user of the
    host). ValueError says what is wrong."""
    name, sep, rest = spec.partition("=")
    envvar, at, hosts = rest.partition("@")
    if not sep or not at or not name or not envvar or not hosts:
        raise ValueError(f"--secret expects NAME=ENVVAR@HOST[,HOST...], got {spec!r}")
    value = environ.get(envvar)
    if not value:
        raise ValueError(f"--secret {name}: the host's environment variable {envvar} is unset")
    return Secret(name, value, hosts.split(","))
