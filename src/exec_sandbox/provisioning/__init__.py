"""Where a request's VM comes from: admission, the warm pool, L1 restores, cold boots."""
