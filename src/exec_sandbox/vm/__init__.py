"""A VM from spawn to close: its spec, its QEMU process, the guest agent channel, QMP and
migration."""
