"""Third-party packages in the sandbox: resolved, fetched and packed on the host into read-only
layers that a VM mounts (docs/packages.md)."""
