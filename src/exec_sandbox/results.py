"""What the API reports for one execution's end: the notes appended to stderr for a timeout or
an OOM kill, and the OutputLimitError for output over the limits."""

from __future__ import annotations

# A guest process ended by SIGKILL (128 + 9), not by the timeout: in a sandbox that is almost
# always the guest kernel's OOM killer.
EXIT_SIGKILL = 137
OOM_NOTE = (
    "\nKilled by SIGKILL (exit 137): most likely the VM ran out of memory and its kernel's OOM "
    "killer ended the process; give it more memory (memory_mb) or make the code use less\n"
)
