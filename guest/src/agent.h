/* sbx-agent: declarations shared by the guest agent's modules.
 *
 * The agent is PID 1 of the guest. It must never exit (the kernel would panic), so every function
 * returns 0 (or a count) on success and a negative errno on failure, and the event loop logs and
 * carries on. Only boot-time failures that leave the VM useless end it, deliberately, by reboot
 * (QEMU runs with -no-reboot, so that stops the VM).
 */
#ifndef SBX_AGENT_H
#define SBX_AGENT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "frame.h"
#include "template_image.h"

#ifndef SBX_AGENT_VERSION
#define SBX_AGENT_VERSION "0.1.0"
#endif

#define SBX_USER_UID 1000
#define SBX_USER_GID 1000
#define SBX_HOME_DIR "/home/user"
#define SBX_RUN_DIR "/run/sbx"

/* Node's startup snapshot (docs/design.md, "JavaScript start-up"). Debian builds node without
 * its built-in one, so every start compiles and runs node's whole bootstrap; a blob of it built
 * by the VM's own node (V8 refuses a blob made on another CPU's feature set, so the image cannot
 * ship one) saves most of that. A snapshot template builds it (snapshots.py) before any user code
 * runs, so its clones have it, and the host keeps a copy for cold-booted VMs of the same machine,
 * which it writes here before their first node starts (SBX_FILE_NODE_SNAPSHOT, cputag.h). The
 * agent passes --snapshot-blob to the VM's node while this file is there. In /tmp, written by
 * uid 1000: only that user's own node processes ever read it. */
#define SBX_NODE_SNAPSHOT "/tmp/.sbx-node-startup.blob"
#define SBX_NODE_BINARY "/usr/bin/node"
/* What the agent runs from the image besides the interpreters: the session REPL drivers, node's
 * pre-start preload and its addon (guest/repl/, guest/node/; images/build-rootfs.sh). */
#define SBX_LIB_DIR "/usr/lib/sbx"

/* How the agent runs: as PID 1 in the VM, or as a test program on the host. */
struct sbx_config {
	bool test_mode; /* --channel-fd given: channel from the fd, exit when the peer closes it */
	bool boot;      /* mounts, hostname, loopback, /run/sbx and /home/user: always as the VM's
			 * PID 1; in test mode only with --boot, inside fresh namespaces */
	bool drop_privileges; /* boot and root: run user code as SBX_USER_UID, and kill all of that
			       * uid's processes after each run (safe only as PID 1 of the guest or
			       * of a PID namespace, which boot implies) */
	int channel_fd;       /* test mode: the channel; otherwise -1 until the port is found */
	int net_fd;           /* test mode: the network port's stand-in (--net-fd), else -1 */
	char run_dir[256];    /* root-owned directory holding the code file */
	char home_dir[256];   /* working directory and HOME of user code */
	const char *interpreter[4]; /* indexed by enum sbx_language */
	char driver_dir[256];       /* REPL drivers and node's preload; empty: SBX_LIB_DIR */
	char node_snapshot[256];    /* SBX_NODE_SNAPSHOT; in test mode, in the work directory */
	bool builder;               /* builder mode (template.h): raw runs as root, in / */
	struct sbx_template tpl;    /* template mode (template.h) when tpl.active */
};

/* log.c: one line on the console (stderr of PID 1 is /dev/console). Never fails. */
void sbx_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t sbx_now_ns(void); /* CLOCK_MONOTONIC */

/* mounts.c */
int sbx_ensure_std_fds(void);
int sbx_mount_all(void); /* also sbx_mount_layers() */
/* Mount the package layer disks the host attached (by their serial); 0 or the first -errno. */
int sbx_mount_layers(void);
/* The host names each disk it attaches by its serial: this prefix and the disk's kind
 * (src/_execsbx/qemu_argv.c). */
#define SBX_DISK_SERIAL_PREFIX "sbx-disk-"
/* The serial of block device `name` (vdb, ...) into buf (NUL-terminated, newline cut); 0 or
 * -errno. */
int sbx_read_serial(const char *name, char *buf, size_t size);
/* The block device (/dev/vdX) of the disk of `kind` into dev; 0, -ENOENT or -errno. */
int sbx_find_disk(const char *kind, char *dev, size_t size);
/* An ext4 superblock starts at byte 1024; its magic is the 16-bit field at offset 56. */
#define SBX_EXT4_SUPER 1024
#define SBX_EXT4_MAGIC_OFFSET (SBX_EXT4_SUPER + 56)
#define SBX_EXT4_MAGIC 0xEF53u

/* net.c */
int sbx_set_hostname(const char *name);
int sbx_loopback_up(void);

#endif /* SBX_AGENT_H */
