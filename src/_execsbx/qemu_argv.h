/* The QEMU command line of one sandbox VM, built in one place from a plain config struct.
 * Pure: no I/O, no globals; the result is a heap argv for execve. */
#ifndef SBX_QEMU_ARGV_H
#define SBX_QEMU_ARGV_H

#include "sbx_err.h"

/* Bounds enforced by sbx_qemu_argv_build (-EINVAL outside them). */
#define SBX_VM_MEMORY_MB_MIN 16u
#define SBX_VM_MEMORY_MB_MAX (1024u * 1024u)
#define SBX_VM_VCPUS_MAX 255u
/* Translation cache of TCG in MiB (see qemu_argv.c): part of the per-VM memory overhead the
 * host jail allows QEMU beyond the guest RAM (jail.py), so keep the two in step. */
#define SBX_TCG_TB_SIZE_MB 128u
/* x86 COMMAND_LINE_SIZE is 2048 including the NUL; longer lines are cut by the kernel. */
#define SBX_KERNEL_CMDLINE_MAX 2047u

/* One disk besides the root: a raw image, read-only unless writable; or a qcow2 overlay on
 * another disk of the list (a forked work disk: the frozen file both VMs share, beneath each
 * VM's own overlay). */
struct sbx_vm_disk {
	const char *path; /* no ',' */
	const char *kind; /* [a-z], 1..SBX_DISK_KIND_MAX bytes, unique in the VM: "python",
			   * "javascript", "template", ... */
	int writable;     /* QEMU may write it (readonly=off; opened O_RDWR by the host) */
	int qcow2;        /* a qcow2 file (made empty by qemu-img on the host), else raw */
	/* qcow2: 1 + the index of the disk beneath it, which must come earlier in the list and be
	 * read-only; that disk is a block node only, with no device (the guest sees one disk).
	 * 0: none (a zero-initialised disk is a plain one). */
	unsigned backing;
	/* writable: how large QEMU may make the file (RLIMIT_FSIZE of a jailed QEMU); 0: its size
	 * now. A qcow2 overlay starts small and grows to its virtual size and some metadata. */
	unsigned long long max_bytes;
};

/* Disks besides the root: one per fd the jail passes at SBX_CHILD_DISK_FD_BASE.. */
#define SBX_VM_DISKS_MAX 6u /* microvm's transports allow no more (qemu_spawn.h) */

struct sbx_vm_config {
	const char *qemu_binary;          /* a path: execve does no PATH search */
	const char *kernel;               /* path, no ',' */
	const char *rootfs;               /* path, no ',' (an EROFS image) */
	unsigned memory_mb;
	unsigned vcpus;
	const char *accel;                /* "kvm" or "tcg" */
	const char *kernel_cmdline_extra; /* may be NULL or "" */
	/* Memory snapshots (all zero/NULL: a plain VM). */
	int qmp;              /* add a QMP monitor on the socket at fd SBX_CHILD_QMP_FD */
	const char *mem_path; /* guest RAM in this file (memory-backend-file); NULL/"": anonymous */
	int mem_shared;       /* mem_path mapped shared (a template being written) or private (a
	                       * copy-on-write clone of a template) */
	int incoming;         /* start paused, waiting for migrate-incoming over QMP (needs qmp) */
	int mem_fd;           /* guest RAM in the file at fd SBX_CHILD_MEM_FD (opened by the host:
	                       * the jail's mount tree is read-only); excludes mem_path */
	int qemu_sandbox;                 /* QEMU's own seccomp filter (-sandbox on,...) */
	/* Extra disks after the root (a package layer, a template, a builder's source and output),
	 * in this order: /dev/vdb, /dev/vdc, ... The guest agent finds each by its serial
	 * "sbx-disk-<kind>", not by its device name. ndisks 0: none (disks may be NULL). */
	const struct sbx_vm_disk *disks;
	unsigned ndisks; /* at most SBX_VM_DISKS_MAX */
	/* The network port (net_protocol.h): a third virtserialport on the socket at fd
	 * SBX_CHILD_NET_FD, for VMs with network or exposed ports. 0: a plain VM, no such port. */
	int net_port;
	/* kernel, rootfs and the disks are handed over as fds 8, 9 and 10.. (qemu_spawn.h) and QEMU
	 * opens /proc/self/fd/N; the paths above stay for checks and messages. */
	int images_by_fd;
};

/* virtio-blk serials are 20 bytes (VIRTIO_BLK_ID_BYTES) and a longer one is cut off, which the
 * agent would then not recognise: "sbx-disk-" leaves 11 for the kind, the bound is 10. */
#define SBX_DISK_KIND_MAX 10u

/* On success *argv_out is a NULL-terminated heap array of heap strings (free with
 * sbx_argv_free) and 0 is returned. On failure, with err filled: -EINVAL (invalid config),
 * -E2BIG (kernel command line too long) or -ENOMEM. */
int sbx_qemu_argv_build(const struct sbx_vm_config *cfg, char ***argv_out, struct sbx_err *err);
void sbx_argv_free(char **argv);
/* Number of entries before the NULL. */
unsigned sbx_argv_count(char *const *argv);

#endif /* SBX_QEMU_ARGV_H */
