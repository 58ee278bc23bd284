/* Volumes (docs/design.md, "Volumes"): disks of kinds "vola".."volc" that outlive VMs. The host
 * creates each empty and locks it for this VM (read-write here alone, or read-only here and in
 * other VMs); this agent formats a fresh read-write one (ext4 with a journal: a VM holding it may
 * be killed at any moment), mounts it under SBX_VOLUMES_DIR and binds it on its mount path. */
#ifndef SBX_VOLUMES_H
#define SBX_VOLUMES_H

#include <stddef.h>

#include "volume_args.h"

/* Root's alone (0700): each volume's file system is mounted at SBX_VOLUMES_DIR/<kind>. */
#define SBX_VOLUMES_DIR "/run/sbx-volumes"

/* Boot, after the workspace: the volumes the kernel command line names, each mounted and bound
 * on its path. A failure is logged and kept (sbx_volumes_error): runs are then refused with it,
 * never run without a volume the caller asked for. */
void sbx_volumes_setup(void);

/* Make what was written to the read-write volumes durable and self-contained: a freeze (which
 * writes every dirty page, commits the journal and checkpoints it) and a thaw. Called before
 * each EXIT is sent, so what an exec wrote is on the disk, with an empty journal, when its
 * result arrives: the host may SIGKILL the VM at any moment after, and a read-only reader
 * (which cannot replay a journal) sees it. Nothing without read-write volumes. */
void sbx_volumes_settle(void);

/* The first failure of sbx_volumes_setup, or NULL. */
const char *sbx_volumes_error(void);

/* The volumes mounted (for the template's root: template.c binds them in), and where. */
size_t sbx_volumes_count(void);
const struct sbx_volume_arg *sbx_volume_at(size_t i);
/* SBX_VOLUMES_DIR/<kind> of volume i into buf; 0 or -ENAMETOOLONG. */
int sbx_volume_source(size_t i, char *buf, size_t size);

#endif /* SBX_VOLUMES_H */
