"""The sandbox's own runtime for python code in the VM: host tools and rich outputs.

`tools.NAME(*args, **kwargs)` calls the function the host registered as NAME (`tools={...}` of
run() or session()) and returns its JSON result; `display(*objs)` sends objects to the host as
rich outputs (HTML, images, ...) beside stdout. Both talk to the agent over its host socket
(docs/protocol.md, "Host tools and rich outputs"). `exec_sandbox_guest.pth` makes `tools` and
`display` built-in names of every python the image starts.

This module is imported by every python start in the VM, so it only defines names: the socket,
JSON and threading come with the first call (`_client`), the formatting with the first display
(`_display`).
"""

__all__ = ["ToolError", "call", "display", "tools"]


class ToolError(Exception):
    """A host tool failed: it raised (the host's message), or the call never reached it (the
    sandbox refused it, `refused` is then True, or the host socket could not be reached)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def call(name: str, *args: object, **kwargs: object) -> object:
    """Call the host tool `name` with JSON-serialisable arguments; returns its decoded JSON
    result. Raises ToolError when the tool fails, TypeError for arguments that are not JSON or
    too large (60 KiB of JSON text)."""
    from . import _client

    return _client.call(name, args, kwargs)


def display(*objs: object) -> None:
    """Send each object to the host as rich outputs, one per MIME type it can render as (its
    `_repr_mimebundle_`, `_repr_html_`, `_repr_png_`, ... and always text/plain), like IPython's
    display(). Outputs the sandbox refuses (over its limits) are reported on stderr."""
    from . import _display

    _display.display(*objs)


class _Tools:
    """`tools.search("x")` is `call("search", "x")`."""

    __slots__ = ()

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        # Private and special names are python's, never a tool: copy, pickle and friends probe
        # for them and must get an AttributeError, not a call to the host.
        if name.startswith("_"):
            raise AttributeError(name)

        def tool(*args: object, **kwargs: object) -> object:
            return call(name, *args, **kwargs)

        tool.__name__ = tool.__qualname__ = name
        tool.__doc__ = f"Call the host tool {name!r}: tools.{name}(*args, **kwargs)."
        return tool

    def __repr__(self) -> str:
        return "<exec-sandbox host tools: tools.NAME(*args, **kwargs) calls the host's NAME>"


tools = _Tools()


def _install_builtins() -> None:
    """Make `tools` and `display` built-in names (run at interpreter start by the .pth file)."""
    import builtins

    builtins.tools = tools  # type: ignore[attr-defined]
    builtins.display = display  # type: ignore[attr-defined]
    _InstalledFinder.register()


class _InstalledFinder:
    """Packages that `pip install` (served by the host, `_install`) added while this interpreter
    runs: on an import that nothing else found, and only when the user site directory changed
    since, put that directory on sys.path and clear the import system's directory caches (a
    `subprocess.run(["pip", "install", ...])` then `import` in the same cell works). A miss
    costs one stat()."""

    _seen: "int | None" = None

    @classmethod
    def register(cls) -> None:
        import os
        import site
        import sys

        if not site.ENABLE_USER_SITE or any(f is cls for f in sys.meta_path):
            return
        try:
            cls._seen = os.stat(site.getusersitepackages()).st_mtime_ns
        except OSError:
            cls._seen = None
        sys.meta_path.append(cls)  # type: ignore[arg-type]

    @classmethod
    def find_spec(cls, name: str, path: object = None, target: object = None) -> object:
        if path is not None or not cls.refresh():
            return None  # a submodule: its package's __path__ already holds the new files
        from importlib.machinery import PathFinder

        return PathFinder.find_spec(name, None, target)  # type: ignore[arg-type]

    @classmethod
    def refresh(cls) -> bool:
        """Whether the user site directory changed since the last look (then it is on sys.path
        and the import caches are clear). The REPL driver asks before each request, so that
        importlib.metadata sees a package a subprocess installed too."""
        import os
        import site

        if not site.ENABLE_USER_SITE:
            return False
        try:
            seen = os.stat(site.getusersitepackages()).st_mtime_ns
        except OSError:
            return False
        if seen == cls._seen:
            return False
        cls._seen = seen
        from . import _install

        _install.refresh()
        return True

    @classmethod
    def invalidate_caches(cls) -> None:
        pass
