/* The QEMU command line: every option and the reason it is there, in one place. */
#define _GNU_SOURCE 1
#include "qemu_argv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net_protocol.h"
#include "protocol.h"
#include "qemu_spawn.h" /* the fds the child finds the two sockets at */

struct argv_builder {
	char **v;
	unsigned n, cap;
	int err; /* sticky: the first failure */
};

static void add_owned(struct argv_builder *b, char *s)
{
	if (b->err || !s) {
		if (!b->err)
			b->err = -ENOMEM;
		free(s);
		return;
	}
	if (b->n + 2 > b->cap) {
		unsigned cap = b->cap ? b->cap * 2 : 48;
		char **v = realloc(b->v, cap * sizeof(*v));
		if (!v) {
			free(s);
			b->err = -ENOMEM;
			return;
		}
		b->v = v;
		b->cap = cap;
	}
	b->v[b->n++] = s;
	b->v[b->n] = NULL;
}

static void add(struct argv_builder *b, const char *s)
{
	add_owned(b, strdup(s));
}

__attribute__((format(printf, 2, 3))) static void addf(struct argv_builder *b, const char *fmt, ...)
{
	char *s = NULL;
	va_list ap;
	va_start(ap, fmt);
	int rc = vasprintf(&s, fmt, ap);
	va_end(ap);
	add_owned(b, rc < 0 ? NULL : s);
}

static int reject(struct sbx_err *err, const char *msg)
{
	return sbx_err_set(err, -EINVAL, "%s", msg);
}

static int has_control_chars(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7f)
			return 1;
	return 0;
}

/* kernel and rootfs: no ',' because QEMU's option parser would split "file=a,b" into two options
 * (escaping by doubling would work, but no sane image path needs a comma); no control characters
 * (they only ever come from a bug). Relative paths are fine: see the -drive line. */
static int check_path(const char *p, struct sbx_err *err, const char *empty, const char *comma)
{
	if (!p || !p[0])
		return reject(err, empty);
	if (strchr(p, ','))
		return reject(err, comma);
	if (has_control_chars(p))
		return reject(err, "paths must not contain control characters");
	return 0;
}

/* Whether disk j backs one of the disks before index `end`. */
static int disk_is_backing(const struct sbx_vm_config *cfg, unsigned j, unsigned end)
{
	for (unsigned i = 0; i < end; i++)
		if (cfg->disks[i].backing == j + 1)
			return 1;
	return 0;
}

/* Each disk: a path like the root's, a kind that fits the serial and names one disk only (the
 * agent mounts by kind: two disks of one kind would leave it guessing). */
static int check_disks(const struct sbx_vm_config *cfg, struct sbx_err *err)
{
	_Static_assert(SBX_VM_DISKS_MAX == SBX_CHILD_DISKS_MAX, "one fd per disk under the jail");
	if (cfg->ndisks > SBX_VM_DISKS_MAX)
		return sbx_err_set(err, -EINVAL, "at most %u disks", SBX_VM_DISKS_MAX);
	if (cfg->ndisks && !cfg->disks)
		return reject(err, "ndisks without disks");
	for (unsigned i = 0; i < cfg->ndisks; i++) {
		const struct sbx_vm_disk *d = &cfg->disks[i];
		int rc = check_path(d->path, err, "disk path must not be empty",
				    "disk path must not contain ','");
		if (rc < 0)
			return rc;
		size_t n = d->kind ? strlen(d->kind) : 0;
		if (n == 0 || n > SBX_DISK_KIND_MAX ||
		    strspn(d->kind, "abcdefghijklmnopqrstuvwxyz") != n)
			return reject(err, "disk kind must be 1..10 lower-case letters");
		for (unsigned j = 0; j < i; j++)
			if (strcmp(cfg->disks[j].kind, d->kind) == 0)
				return sbx_err_set(err, -EINVAL, "two disks of kind \"%s\"",
						   d->kind);
		if (!d->backing)
			continue;
		if (!d->qcow2)
			return reject(err, "only a qcow2 disk has a backing disk");
		/* Earlier in the list: its node exists when this one's is made, and no chain
		 * can loop. */
		if (d->backing > i)
			return reject(err, "a disk's backing disk must come earlier in the list");
		if (cfg->disks[d->backing - 1].writable)
			return reject(err, "a backing disk must be read-only");
		if (disk_is_backing(cfg, d->backing - 1, i))
			return reject(err, "two disks on one backing disk");
	}
	return 0;
}

/* Boot time under TCG, where the guest's clock runs while QEMU emulates (docs/benchmarks.md, "Cold
 * boot under TCG"). TCG's CPU has no TSC-deadline timer, so the kernel would calibrate the local
 * APIC timer against the PIT, busy-waiting 2 x 10 ticks (~0.2 s emulated): QEMU's APIC timer
 * counts at 1 GHz, and lapic_timer_khz= (our kernel patch, images/kernel/patches/) says so.
 * (nolapic_timer saves the same but leaves the PIT as the timer: its 16-bit counter wakes an
 * idle guest every 55 ms, ~1 % of a core per idle VM.) no_timer_check skips a busy-wait check of
 * the IO-APIC timer route (~50 ms), whose answer for QEMU's microvm is known. tsc=reliable: the
 * kernel's watchdog compares the TSC with jiffies, which lag when the emulation is slow, and
 * then falls back to a 10 ms jiffies clock; TCG's TSC follows the host's clock, so keep it (and
 * high-resolution timers). KVM guests get the host CPU's TSC-deadline timer and kvm-clock, and
 * keep the defaults. */
#define TCG_BOOT_ARGS " lapic_timer_khz=1000000 no_timer_check tsc=reliable"

int sbx_qemu_argv_build(const struct sbx_vm_config *cfg, char ***argv_out, struct sbx_err *err)
{
	int rc;
	const char *extra = cfg->kernel_cmdline_extra ? cfg->kernel_cmdline_extra : "";

	*argv_out = NULL;
	if (!cfg->qemu_binary || !cfg->qemu_binary[0])
		return reject(err, "qemu_binary must not be empty");
	rc = check_path(cfg->kernel, err, "kernel must not be empty",
			"kernel path must not contain ','");
	if (rc < 0)
		return rc;
	rc = check_path(cfg->rootfs, err, "rootfs must not be empty",
			"rootfs path must not contain ','");
	if (rc < 0)
		return rc;
	if (cfg->memory_mb < SBX_VM_MEMORY_MB_MIN || cfg->memory_mb > SBX_VM_MEMORY_MB_MAX)
		return reject(err, "memory_mb out of range (16 .. 1048576)");
	if (cfg->vcpus < 1 || cfg->vcpus > SBX_VM_VCPUS_MAX)
		return reject(err, "vcpus out of range (1 .. 255)");
	if (!cfg->accel || (strcmp(cfg->accel, "kvm") != 0 && strcmp(cfg->accel, "tcg") != 0))
		return reject(err, "accel must be \"kvm\" or \"tcg\"");
	if (has_control_chars(extra))
		return reject(err, "kernel_cmdline_extra must not contain control characters");
	const char *mem_path = cfg->mem_path && cfg->mem_path[0] ? cfg->mem_path : NULL;
	if (mem_path && cfg->mem_fd)
		return reject(err, "mem_path and mem_fd exclude each other");
	if (cfg->mem_fd)
		mem_path = SBX_CHILD_MEM_FD_PATH;
	else if (mem_path) {
		rc = check_path(mem_path, err, "mem_path must not be empty",
				"mem_path must not contain ','");
		if (rc < 0)
			return rc;
	}
	if (cfg->incoming && !cfg->qmp)
		return reject(err, "incoming needs qmp (the migration is started over QMP)");
	rc = check_disks(cfg, err);
	if (rc < 0)
		return rc;

	struct argv_builder b = {0};
	add(&b, cfg->qemu_binary);

	/* microvm: no PCI, no firmware tables, no legacy devices; only virtio-mmio. No option
	 * ROMs (nothing to boot from but -kernel), no ISA serial port (the console is virtio),
	 * no ACPI (virtio-mmio devices are announced on the kernel command line by QEMU instead).
	 * The 8259 PIC stays: without it the kernel cannot register the PIT's interrupt, then
	 * fails to verify the local APIC timer against it, and every sleep in the guest hangs. */
	add(&b, "-M");
	add(&b, "microvm,x-option-roms=off,isa-serial=off,acpi=off,memory-backend=ram0");
	/* Guest RAM is always the backend "ram0", so that a migration stream of any VM loads into
	 * any other (a paused session resumed, a session's state loaded as a fork template).
	 * Memory snapshots: RAM in a file. The VM that makes a template maps it shared, so the file
	 * holds its RAM and migration only has to write the device state (x-ignore-shared); a
	 * clone maps the same file private, so it reads the template's pages copy-on-write and
	 * many clones share the unchanged ones. Any other VM: anonymous memory (never a private
	 * mapping of an empty file: a fault on a hole of a shmem file allocates the page in the
	 * file too, charging it twice). */
	add(&b, "-object");
	if (mem_path)
		addf(&b, "memory-backend-file,id=ram0,size=%uM,mem-path=%s%s,share=%s", cfg->memory_mb,
		     mem_path[0] == '/' ? "" : "./", mem_path, cfg->mem_shared ? "on" : "off");
	else
		addf(&b, "memory-backend-ram,id=ram0,size=%uM", cfg->memory_mb);
	/* KVM: expose the host CPU as is. TCG: "max" enables every feature TCG can emulate, but
	 * ERMS: with it, glibc and the kernel copy and clear memory with `rep movsb`/`rep stosb`,
	 * which TCG runs one byte per step (a page cleared or copied costs 4096 steps); without it
	 * they use 8-byte or vector loops. Cold boot + python run: ~0.95 s -> ~0.8 s.
	 * TCG's translation cache defaults to 1 GiB on x86_64 hosts and grows with every program
	 * the guest runs: a long session then passes the cgroup's memory limit (guest RAM + a
	 * fixed overhead) and is OOM-killed. SBX_TCG_TB_SIZE_MB bounds it; a full cache is flushed
	 * and refilled, which costs retranslation, not correctness. */
	add(&b, "-accel");
	if (strcmp(cfg->accel, "tcg") == 0)
		addf(&b, "tcg,tb-size=%u", SBX_TCG_TB_SIZE_MB);
	else
		add(&b, cfg->accel);
	add(&b, "-cpu");
	add(&b, strcmp(cfg->accel, "kvm") == 0 ? "host" : "max,-erms");
	add(&b, "-m");
	addf(&b, "%u", cfg->memory_mb);
	add(&b, "-smp");
	addf(&b, "%u", cfg->vcpus);
	/* Only the devices listed below: no default NIC, serial, parallel, monitor or display. */
	add(&b, "-nodefaults");
	/* Ignore any qemu.conf in the host's /etc. */
	add(&b, "-no-user-config");
	add(&b, "-display");
	add(&b, "none");
	/* A guest reboot (including panic=-1 below) ends QEMU instead of restarting the VM. */
	add(&b, "-no-reboot");
	/* QEMU's own seccomp allow-list on top of the host jail's deny-list (both stay in force:
	 * stacked filters all apply). Deny obsolete calls, setuid/setgid and friends, fork/exec,
	 * and scheduler/affinity/priority changes. */
	if (cfg->qemu_sandbox) {
		add(&b, "-sandbox");
		add(&b, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
	}

	/* Direct kernel boot. The rootfs is a read-only EROFS image; the agent is PID 1.
	 * panic=-1: reboot at once on panic, which -no-reboot turns into QEMU exiting.
	 * random.trust_cpu=on: seed the CRNG from RDRAND so getrandom() does not block at boot. */
	add(&b, "-kernel");
	add(&b, cfg->images_by_fd ? SBX_CHILD_KERNEL_FD_PATH : cfg->kernel);
	add(&b, "-append");
	addf(&b,
	     "console=hvc0 quiet root=/dev/vda rootfstype=erofs ro init=/usr/sbin/sbx-agent panic=-1 "
	     "random.trust_cpu=on%s%s%s",
	     strcmp(cfg->accel, "tcg") == 0 ? TCG_BOOT_ARGS : "", extra[0] ? " " : "", extra);
	if (!b.err && strlen(b.v[b.n - 1]) > SBX_KERNEL_CMDLINE_MAX) {
		sbx_argv_free(b.v);
		return sbx_err_set(err, -E2BIG, "kernel command line too long");
	}

	/* The root disk: raw image, read-only on the QEMU side too, as /dev/vda. A relative path
	 * gets "./" in front: QEMU reads "name:" before the first '/' as a block protocol prefix
	 * ("nbd:...", "json:{...}"), and "./" makes it a plain file name in every case. */
	const char *rootfs = cfg->images_by_fd ? SBX_CHILD_ROOTFS_FD_PATH : cfg->rootfs;
	add(&b, "-drive");
	addf(&b, "file=%s%s,if=none,id=root,format=raw,readonly=on", rootfs[0] == '/' ? "" : "./",
	     rootfs);
	add(&b, "-device");
	add(&b, "virtio-blk-device,drive=root");
	/* The other disks, after the root so that it stays /dev/vda, in the caller's order. The
	 * agent finds each by its serial, not by its device name. Read-only unless the caller
	 * asked for a writable one (a builder's output). A writable disk: an I/O error (the host's
	 * disk full) goes to the guest, whose file system reports it to the code (werror=enospc,
	 * the default, would pause the VM with nothing to resume it); the guest's discards punch
	 * holes in the file (or mark a qcow2 overlay's clusters zero). */
	for (unsigned i = 0; i < cfg->ndisks; i++) {
		const struct sbx_vm_disk *d = &cfg->disks[i];
		char fd_path[32];
		const char *path = d->path;
		if (cfg->images_by_fd) {
			snprintf(fd_path, sizeof(fd_path), "/proc/self/fd/%u",
				 SBX_CHILD_DISK_FD_BASE + i);
			path = fd_path;
		}
		const char *dot = path[0] == '/' ? "" : "./";
		const char *ro = d->writable ? "off" : "on";
		const char *errors = d->writable ? ",werror=report,rerror=report" : "";
		const char *discard = d->writable ? ",discard=unmap" : "";
		int backs = disk_is_backing(cfg, i, cfg->ndisks);
		if (!d->qcow2 && !backs) {
			add(&b, "-drive");
			addf(&b, "file=%s%s,if=none,id=disk%u,format=raw,readonly=%s%s%s", dot, path,
			     i, ro, errors, discard);
		} else {
			/* A chain of block nodes: the file, then its format on it (and on the disk
			 * beneath, for an overlay). No locking: these files are this VM's or frozen,
			 * and the host, which made them, is the only one that hands them out. */
			add(&b, "-blockdev");
			addf(&b, "driver=file,node-name=disk%uf,filename=%s%s,read-only=%s,locking=off%s",
			     i, dot, path, ro, discard);
			add(&b, "-blockdev");
			if (d->backing)
				addf(&b, "driver=qcow2,node-name=disk%u,file=disk%uf,backing=disk%u,read-only=%s%s",
				     i, i, d->backing - 1, ro, discard);
			else
				addf(&b, "driver=%s,node-name=disk%u,file=disk%uf,read-only=%s%s",
				     d->qcow2 ? "qcow2" : "raw", i, i, ro, discard);
		}
		if (backs)
			continue; /* beneath another disk: no device of its own */
		add(&b, "-device");
		/* On the device for a -blockdev node, which has no -drive to hold them. */
		addf(&b, "virtio-blk-device,drive=disk%u,serial=sbx-disk-%s%s", i, d->kind,
		     d->qcow2 || backs ? errors : "");
	}

	/* One virtio-serial bus with two ports: the console (hvc0) and the agent channel, and a
	 * third, the network port, only for a VM that asked for it (a plain VM's device layout, and
	 * hence its snapshots, stay as they were). Every chardev is a socket the host already holds
	 * the other end of (qemu_spawn.c puts them at fds 3, 4 and 7): no paths, no listening
	 * sockets, nothing another process could connect to. */
	add(&b, "-device");
	addf(&b, "virtio-serial-device,max_ports=%d", cfg->net_port ? 3 : 2);
	add(&b, "-chardev");
	addf(&b, "socket,id=con,fd=%d", SBX_CHILD_CONSOLE_FD);
	add(&b, "-device");
	add(&b, "virtconsole,chardev=con");
	add(&b, "-chardev");
	addf(&b, "socket,id=agent,fd=%d", SBX_CHILD_CHANNEL_FD);
	add(&b, "-device");
	add(&b, "virtserialport,chardev=agent,name=" SBX_CHANNEL_PORT_NAME);
	if (cfg->net_port) {
		add(&b, "-chardev");
		addf(&b, "socket,id=net,fd=%d", SBX_CHILD_NET_FD);
		add(&b, "-device");
		add(&b, "virtserialport,chardev=net,name=" SBX_NET_PORT_NAME);
	}

	/* QMP for snapshots: on a socket the host holds the other end of, like the chardevs above. */
	if (cfg->qmp) {
		add(&b, "-chardev");
		addf(&b, "socket,id=qmp,fd=%d", SBX_CHILD_QMP_FD);
		add(&b, "-mon");
		add(&b, "chardev=qmp,mode=control");
	}
	/* A clone starts paused; the host feeds it the template's device state over QMP. */
	if (cfg->incoming) {
		add(&b, "-incoming");
		add(&b, "defer");
	}

	if (b.err) {
		sbx_argv_free(b.v);
		return sbx_err_set(err, b.err, "out of memory building the QEMU command line");
	}
	*argv_out = b.v;
	return 0;
}

void sbx_argv_free(char **argv)
{
	if (!argv)
		return;
	for (char **p = argv; *p; p++)
		free(*p);
	free(argv);
}

unsigned sbx_argv_count(char *const *argv)
{
	unsigned n = 0;
	while (argv && argv[n])
		n++;
	return n;
}
