"""Where exec-sandbox keeps its per-user files. images/lib.sh follows the same rules."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$EXEC_SANDBOX_CACHE_DIR, else $XDG_CACHE_HOME/exec-sandbox, else ~/.cache/exec-sandbox."""
    explicit = os.environ.get("EXEC_SANDBOX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "exec-sandbox"


def data_dir() -> Path:
    """$EXEC_SANDBOX_DATA_DIR, else $XDG_DATA_HOME/exec-sandbox, else ~/.local/share/exec-sandbox:
    the user's data (volumes), which a cache cleaner must not remove."""
    explicit = os.environ.get("EXEC_SANDBOX_DATA_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "exec-sandbox"


def images_dir() -> Path:
    """$EXEC_SANDBOX_IMAGES_DIR, else <cache_dir>/images."""
    explicit = os.environ.get("EXEC_SANDBOX_IMAGES_DIR")
    return Path(explicit) if explicit else cache_dir() / "images"


def state_dir() -> Path:
    """$EXEC_SANDBOX_STATE_DIR, else $XDG_STATE_HOME/exec-sandbox, else
    ~/.local/state/exec-sandbox: what `sbx serve` keeps between runs (its tokens, who owns
    which paused session)."""
    explicit = os.environ.get("EXEC_SANDBOX_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "exec-sandbox"


def server_socket() -> Path:
    """Where `sbx serve` listens by default (and clients look first):
    $XDG_RUNTIME_DIR/exec-sandbox/sbx.sock, else <state_dir>/sbx.sock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "exec-sandbox" if runtime else state_dir()
    return base / "sbx.sock"
