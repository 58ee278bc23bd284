"""Saved VM state: L1 memory snapshots, paused and forked sessions, node's startup blob."""
