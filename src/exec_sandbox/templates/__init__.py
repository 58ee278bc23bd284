"""Templates: whole environments (a container image's tree, the default image, or another
template, plus build steps) made once into a read-only disk that VMs start from.

`steps` is what callers write (Run, Copy, Env, Workdir, User, the Sandboxfile parser); `oci`
imports a container image with skopeo and checks it; `store` keeps the built disks and their
records. The builder VM and the run path live elsewhere (they need the VM layer)."""

from .oci import ImportedImage, import_image
from .steps import Copy, Env, Run, Step, User, Workdir, parse_sandboxfile, validate_steps
from .store import TemplateStore

__all__ = [
    "Copy",
    "Env",
    "ImportedImage",
    "Run",
    "Step",
    "TemplateStore",
    "User",
    "Workdir",
    "import_image",
    "parse_sandboxfile",
    "validate_steps",
]
