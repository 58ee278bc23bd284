/* QEMU process lifecycle without Python: see vm.h. */
#define _GNU_SOURCE 1
#include "vm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "jail.h"

#include <stdio.h>
#include <stdlib.h>

/* QEMU gets a fixed, minimal environment: nothing of the host's (tokens, proxies, LD_*)
 * leaks into it. */
static char qemu_path[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
static char *const qemu_envp[] = {qemu_path, NULL};

void sbx_vm_init(struct sbx_vm *vm)
{
	vm->child.pid = -1;
	vm->child.pidfd = -1;
	vm->console_fd = -1;
	vm->qmp_fd = -1;
	vm->net_fd = -1;
	vm->reaped = 0;
	vm->wait_status = 0;
	vm->closed = 1;
	vm->jail = NULL;
	vm->spawn.err_fd = -1;
	vm->spawn.go_fd = -1;
	vm->spawn.jail = NULL;
	vm->spawn_rc = 0;
	sbx_err_clear(&vm->spawn_err);
	sbx_channel_init(&vm->ch, -1);
}

/* The disks' fds, open while the child is started (it gets copies). */
struct disk_fds {
	int fd[SBX_VM_DISKS_MAX];
	unsigned n;
};

static void close_disk_fds(struct disk_fds *d)
{
	for (unsigned i = 0; i < d->n; i++)
		sbx_close_fd(&d->fd[i]);
}

#define _cleanup_disk_fds_ __attribute__((cleanup(close_disk_fds)))

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static int start_in(struct sbx_vm *vm, char *const *argv, const struct sbx_vm_start_opts *opts,
		    struct sbx_jail *jail, struct sbx_err *err);

int sbx_vm_start(struct sbx_vm *vm, char *const *argv, const struct sbx_vm_start_opts *opts,
		 struct sbx_err *err)
{
	const struct sbx_jail_config *cfg = opts->jail;
	if (!cfg)
		return start_in(vm, argv, opts, NULL, err);
	static unsigned long counter;
	char name[64];
	snprintf(name, sizeof(name), "sbx-%d-%lu", (int)getpid(),
		 __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
	struct sbx_jail *jail = calloc(1, sizeof(*jail));
	if (!jail)
		return sbx_err_sys(err, -ENOMEM, "malloc");
	int rc = sbx_jail_prepare(jail, cfg, name, err);
	if (rc < 0) {
		sbx_jail_destroy(jail);
		free(jail);
		return rc;
	}
	rc = start_in(vm, argv, opts, jail, err);
	if (rc < 0) {
		sbx_jail_destroy(jail);
		free(jail);
		return rc;
	}
	if (vm->jail) {
		sbx_jail_destroy(vm->jail);
		free(vm->jail);
	}
	vm->jail = jail;
	return 0;
}

int sbx_vm_spawn_fd(const struct sbx_vm *vm)
{
	return vm->spawn.err_fd;
}

int sbx_vm_start_check(struct sbx_vm *vm, int blocking, struct sbx_err *err)
{
	if (vm->spawn_rc == 0) {
		if (vm->spawn.err_fd < 0)
			return sbx_err_set(err, -EBADF, "this Vm's start is no longer known (closed)");
		int rc = sbx_spawn_finish(&vm->spawn, blocking, &vm->spawn_err);
		if (rc == 0)
			return 0;
		vm->spawn_rc = rc;
	}
	*err = vm->spawn_err;
	return vm->spawn_rc;
}

static int start_in(struct sbx_vm *vm, char *const *argv, const struct sbx_vm_start_opts *opts,
		    struct sbx_jail *jail, struct sbx_err *err)
{
	int chan[2], con[2], qmp[2] = {-1, -1}, net[2] = {-1, -1};
	int with_qmp = opts->with_qmp, with_net = opts->with_net;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) < 0) {
		return sbx_err_sys(err, -errno, "socketpair");
	}
	_cleanup_close_ int chan_host = chan[0];
	_cleanup_close_ int chan_qemu = chan[1];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, con) < 0) {
		return sbx_err_sys(err, -errno, "socketpair");
	}
	_cleanup_close_ int con_host = con[0];
	_cleanup_close_ int con_qemu = con[1];
	if (with_qmp && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qmp) < 0) {
		return sbx_err_sys(err, -errno, "socketpair");
	}
	_cleanup_close_ int qmp_host = qmp[0];
	_cleanup_close_ int qmp_qemu = qmp[1];
	if (with_net && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, net) < 0) {
		return sbx_err_sys(err, -errno, "socketpair");
	}
	_cleanup_close_ int net_host = net[0];
	_cleanup_close_ int net_qemu = net[1];
	/* Only the host ends: O_NONBLOCK is per open file, QEMU's ends stay as QEMU wants. */
	int rc = set_nonblock(chan_host);
	if (rc == 0)
		rc = set_nonblock(con_host);
	if (rc == 0 && with_qmp)
		rc = set_nonblock(qmp_host);
	if (rc == 0 && with_net)
		rc = set_nonblock(net_host);
	if (rc < 0) {
		return sbx_err_sys(err, rc, "fcntl(O_NONBLOCK)");
	}

	int kernel_fd = -1, rootfs_fd = -1;
	if (opts->kernel) {
		kernel_fd = open(opts->kernel, O_RDONLY | O_CLOEXEC);
		if (kernel_fd < 0)
			return sbx_err_sys(err, -errno, "open(kernel)");
	}
	_cleanup_close_ int kernel_keep = kernel_fd;
	if (opts->kernel) {
		rootfs_fd = open(opts->rootfs, O_RDONLY | O_CLOEXEC);
		if (rootfs_fd < 0)
			return sbx_err_sys(err, -errno, "open(rootfs)");
	}
	_cleanup_close_ int rootfs_keep = rootfs_fd;
	if (opts->ndisks > SBX_VM_DISKS_MAX)
		return sbx_err_set(err, -EINVAL, "at most %u disks", SBX_VM_DISKS_MAX);
	_cleanup_disk_fds_ struct disk_fds disks = {.n = 0};
	uint64_t writable_max = 0;
	int writable_any = 0;
	for (unsigned i = 0; opts->kernel && i < opts->ndisks; i++) {
		const struct sbx_vm_disk *d = &opts->disks[i];
		int fd = open(d->path, (d->writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
		if (fd < 0)
			return sbx_err_sys(err, -errno, "open(disk %s)", d->kind);
		disks.fd[disks.n++] = fd;
		if (!d->writable)
			continue;
		struct stat st;
		if (fstat(fd, &st) < 0)
			return sbx_err_sys(err, -errno, "fstat(disk %s)", d->kind);
		writable_any = 1;
		uint64_t may_grow_to = d->max_bytes ? d->max_bytes : (uint64_t)st.st_size;
		if (may_grow_to > writable_max)
			writable_max = may_grow_to;
		/* QEMU reopens it by /proc/self/fd/N for writing, like the RAM file below. */
		if (jail && jail->uid > 0 &&
		    fchown(fd, (uid_t)jail->uid, (gid_t)(jail->gid >= 0 ? jail->gid : jail->uid)) < 0)
			return sbx_err_sys(err, -errno, "fchown(disk %s)", d->kind);
	}
	if (jail && writable_any)
		sbx_jail_allow_file_size(jail, writable_max);
	/* QEMU reopens the RAM file by /proc/self/fd/6 for reading and writing (memory-backend-file
	 * takes a path, not an fd), which checks the file's mode: a QEMU under its own uid must own
	 * it. The file is the caller's, in its private cache; nothing else of QEMU's uid can reach it
	 * (other QEMUs see only their own root). */
	if (jail && jail->uid > 0 && opts->with_mem &&
	    fchown(opts->mem_fd, (uid_t)jail->uid, (gid_t)(jail->gid >= 0 ? jail->gid : jail->uid)) < 0)
		return sbx_err_sys(err, -errno, "fchown(RAM file)");

	struct sbx_spawn_req req = {
		.path = argv[0],
		.argv = argv,
		.envp = qemu_envp,
		.channel_fd = chan_qemu,
		.console_fd = con_qemu,
		.with_qmp = with_qmp,
		.qmp_fd = qmp_qemu,
		.jail = jail,
		.with_mem = opts->with_mem,
		.mem_fd = opts->mem_fd,
		.with_net = with_net,
		.net_fd = net_qemu,
		.with_images = opts->kernel != NULL,
		.kernel_fd = kernel_keep,
		.rootfs_fd = rootfs_keep,
		.ndisks = disks.n,
	};
	for (unsigned i = 0; i < disks.n; i++)
		req.disk_fds[i] = disks.fd[i];
	struct sbx_child child;
	struct sbx_spawn_pending pending;
	rc = sbx_spawn_start(&req, &child, &pending, err);
	if (rc < 0)
		return rc;

	vm->child = child;
	vm->console_fd = TAKE_FD(con_host);
	vm->qmp_fd = with_qmp ? TAKE_FD(qmp_host) : -1;
	vm->net_fd = with_net ? TAKE_FD(net_host) : -1;
	vm->reaped = 0;
	vm->wait_status = 0;
	vm->closed = 0;
	vm->spawn = pending;
	vm->spawn_rc = 0;
	sbx_err_clear(&vm->spawn_err);
	sbx_channel_destroy(&vm->ch);
	sbx_channel_init(&vm->ch, TAKE_FD(chan_host));
	return 0; /* the QEMU ends are closed here: QEMU holds the only copies */
}

int sbx_vm_kill(struct sbx_vm *vm, struct sbx_err *err)
{
	if (vm->reaped || vm->child.pid <= 0)
		return 0;
	int rc = sbx_child_signal(&vm->child, SIGKILL);
	if (rc == -ESRCH)
		return 0; /* already gone (a zombie waiting to be reaped) */
	return rc < 0 ? sbx_err_sys(err, rc, "pidfd_send_signal") : 0;
}

int sbx_vm_poll_exit(struct sbx_vm *vm, int *returncode, struct sbx_err *err)
{
	if (!vm->reaped) {
		if (vm->child.pid <= 0)
			return 0; /* closing in another thread: not reaped yet */
		int status;
		int rc = sbx_child_wait(&vm->child, 0, &status);
		if (rc < 0)
			return sbx_err_sys(err, rc, "waitid");
		if (rc == 0)
			return 0;
		vm->reaped = 1;
		vm->wait_status = status;
	}
	*returncode = sbx_status_to_returncode(vm->wait_status);
	return 1;
}

ssize_t sbx_vm_read_console(struct sbx_vm *vm, void *buf, size_t n, struct sbx_err *err)
{
	size_t got = 0;
	if (vm->console_fd < 0)
		return sbx_err_sys(err, -EBADF, "recv");
	while (got < n) {
		ssize_t r = recv(vm->console_fd, (char *)buf + got, n - got, MSG_DONTWAIT);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNRESET)
				break;
			if (got)
				break;
			return sbx_err_sys(err, -errno, "recv");
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

void sbx_vm_begin_close(struct sbx_vm *vm, struct sbx_vm_remains *r)
{
	struct sbx_err ignored = {0}; /* a failed kill shows in the reap that follows */
	sbx_vm_kill(vm, &ignored);
	r->child = vm->child;
	r->reaped = vm->reaped;
	r->fds[0] = sbx_channel_take_fd(&vm->ch);
	r->fds[1] = vm->console_fd;
	r->fds[2] = vm->qmp_fd;
	r->fds[3] = vm->spawn.err_fd;
	r->fds[4] = vm->spawn.go_fd;
	r->fds[5] = vm->net_fd;
	vm->spawn.err_fd = -1;
	vm->spawn.go_fd = -1;
	r->jail = vm->jail;
	vm->jail = NULL;
	vm->console_fd = -1;
	vm->qmp_fd = -1;
	vm->net_fd = -1;
	vm->child.pid = -1;
	vm->child.pidfd = -1;
	vm->closed = 1;
	sbx_channel_destroy(&vm->ch); /* fd already taken: frees the buffers only */
}

int sbx_vm_finish_close(struct sbx_vm_remains *r)
{
	int status = -1;
	if (!r->reaped && r->child.pid > 0) {
		int st;
		if (sbx_child_wait(&r->child, 1, &st) == 1)
			status = st;
	}
	sbx_close_fd(&r->child.pidfd);
	r->child.pid = -1;
	for (unsigned i = 0; i < sizeof(r->fds) / sizeof(r->fds[0]); i++)
		sbx_close_fd(&r->fds[i]);
	if (r->jail)
		sbx_jail_finish(r->jail); /* QEMU is reaped: its cgroup is empty */
	return status;
}

void sbx_vm_set_final_status(struct sbx_vm *vm, int status)
{
	if (!vm->reaped && status >= 0) {
		vm->reaped = 1;
		vm->wait_status = status;
	}
}

void sbx_vm_keep_jail(struct sbx_vm *vm, struct sbx_vm_remains *r)
{
	if (!r->jail)
		return;
	if (vm->jail) {
		sbx_jail_destroy(vm->jail);
		free(vm->jail);
	}
	vm->jail = r->jail;
	r->jail = NULL;
}

void sbx_vm_close(struct sbx_vm *vm)
{
	struct sbx_vm_remains r;
	if (vm->closed && vm->child.pid <= 0 && vm->console_fd < 0 && vm->qmp_fd < 0 &&
	    vm->net_fd < 0 && vm->ch.fd < 0 && vm->spawn.err_fd < 0 && vm->spawn.go_fd < 0)
		return;
	sbx_vm_begin_close(vm, &r);
	sbx_vm_set_final_status(vm, sbx_vm_finish_close(&r));
	sbx_vm_keep_jail(vm, &r);
}

void sbx_vm_destroy(struct sbx_vm *vm)
{
	sbx_vm_close(vm);
	if (vm->jail) {
		sbx_jail_destroy(vm->jail);
		free(vm->jail);
		vm->jail = NULL;
	}
}
