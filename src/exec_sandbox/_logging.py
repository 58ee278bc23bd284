"""EXEC_SANDBOX_LOG_LEVEL: the level of the `exec_sandbox` logger, read once."""

from __future__ import annotations

import functools
import logging
import os


@functools.cache
def configure_from_env() -> None:
    level = os.environ.get("EXEC_SANDBOX_LOG_LEVEL")
    if not level:
        return
    logger = logging.getLogger("exec_sandbox")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("exec_sandbox %(levelname)s %(message)s"))
        logger.addHandler(handler)
