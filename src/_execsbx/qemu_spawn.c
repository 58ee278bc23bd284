/* clone+exec of QEMU: see qemu_spawn.h. The child half (child_exec) runs between clone() and
 * execve() in the memory of a possibly multi-threaded process, on a stack of its own: it may only
 * make async-signal-safe calls, read memory prepared before the clone and write nothing but its
 * own stack (no malloc, no stdio, no locks, no glibc call that keeps state). */
#define _GNU_SOURCE 1
#include "qemu_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "jail.h"

#ifdef SBX_TESTING
struct sbx_forced_fallbacks sbx_forced_fallbacks;
#define FORCED(which) (sbx_forced_fallbacks.which)
#else
#define FORCED(which) 0
#endif

/* Under ASan (the C tests), the child's stack is memory ASan did not make: its shadow is cleared
 * before each use (a previous child that ended in _exit left its frames' redzones poisoned there),
 * and the functions that never return are not instrumented (ASan would try to unpoison a stack
 * it cannot find, and warn). */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CHILD_NORETURN __attribute__((noreturn, no_sanitize("address")))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define CHILD_NORETURN __attribute__((noreturn))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* glibc < 2.36 has no P_PIDFD in idtype_t; the kernel's value is 3 (linux/wait.h). */
#define SBX_P_PIDFD ((idtype_t)3)

/* Which call failed in the child, reported through the error pipe. */
enum child_step {
	STEP_SIGMASK,
	STEP_PDEATHSIG,
	STEP_SETPGID,
	STEP_DUP,
	STEP_DUP2,
	STEP_CLOSE,
	STEP_NO_NEW_PRIVS,
	STEP_EXECVE,
	STEP_GO,
	STEP_JAIL,
	STEP_CGROUP,
	STEP__COUNT,
};

static const char *const step_names[STEP__COUNT] = {
	[STEP_SIGMASK] = "sigprocmask",
	[STEP_PDEATHSIG] = "prctl(PR_SET_PDEATHSIG)",
	[STEP_SETPGID] = "setpgid",
	[STEP_DUP] = "fcntl(F_DUPFD_CLOEXEC)",
	[STEP_DUP2] = "dup2",
	[STEP_CLOSE] = "close_range",
	[STEP_NO_NEW_PRIVS] = "prctl(PR_SET_NO_NEW_PRIVS)",
	[STEP_EXECVE] = "execve",
	[STEP_GO] = "poll(go pipe)",
	[STEP_JAIL] = "jail",
	[STEP_CGROUP] = "cgroup",
};

struct child_report {
	int32_t err;
	int32_t step;
	int32_t fatal; /* 0: a layer the child went on without (STEP_CGROUP); more may follow */
	/* STEP_JAIL: the jail step's name, a pointer to a string literal, valid in the parent too
	 * (the child shares the parent's memory). */
	const char *what;
};

/* Everything the child uses, computed before the clone and only read by the child. */
struct child_plan {
	const struct sbx_spawn_req *req;
	int devnull;
	int err_w;
	int go_r, go_w; /* the parent holds go_w until the child's exec (a hang-up: it died) */
	int new_pid_ns; /* getppid() is 0 in a new PID namespace */
	pid_t parent;
	unsigned max_fd; /* upper bound for the close loop when close_range is unavailable */
	struct sigaction dfl;
	sigset_t empty;
};

static void kill_and_reap(pid_t *pid)
{
	if (*pid > 0) {
		int saved = errno;
		kill(*pid, SIGKILL);
		while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
			;
		errno = saved;
		*pid = -1;
	}
}
/* A child that must not outlive an error path: SIGKILL and reap it at scope exit. */
#define _cleanup_child_ __attribute__((cleanup(kill_and_reap)))

CHILD_NORETURN static void child_fail_what(int fd, enum child_step step, int err,
						       const char *what)
{
	struct child_report r = {.err = err, .step = (int32_t)step, .fatal = 1, .what = what};
	ssize_t w;
	do
		w = write(fd, &r, sizeof(r));
	while (w < 0 && errno == EINTR);
	_exit(127);
}

/* A layer the child goes on without: reported, not fatal. */
static void child_warn(int fd, enum child_step step, int err, const char *what)
{
	struct child_report r = {.err = err, .step = (int32_t)step, .fatal = 0, .what = what};
	ssize_t w;
	do
		w = write(fd, &r, sizeof(r));
	while (w < 0 && errno == EINTR);
}

CHILD_NORETURN static void child_fail(int fd, enum child_step step, int err)
{
	child_fail_what(fd, step, err, NULL);
}

static int close_from(unsigned lo, unsigned hi, unsigned max_fd)
{
	if (lo > hi)
		return 0;
#ifdef SYS_close_range
	if (FORCED(no_close_range))
		errno = ENOSYS;
	else if (syscall(SYS_close_range, lo, hi, 0) == 0)
		return 0;
	if (errno != ENOSYS && errno != EINVAL)
		return -1;
#endif
	/* Kernel < 5.9: close one by one up to the fd limit taken before fork(). */
	for (unsigned fd = lo; fd <= hi && fd <= max_fd; fd++)
		close((int)fd);
	return 0;
}

/* glibc's sigaction refuses its reserved signals (32 and 33); the kernel does not, and an
 * inherited SIG_IGN on them would otherwise survive execve. The kernel's struct sigaction. */
static void reset_reserved_signal(int sig)
{
#if defined(SYS_rt_sigaction) && (defined(__x86_64__) || defined(__aarch64__))
	struct {
		void *handler; /* SIG_DFL */
		unsigned long flags;
		void *restorer;
		uint64_t mask;
	} k = {0};
	syscall(SYS_rt_sigaction, sig, &k, NULL, sizeof(k.mask));
#else
	(void)sig;
#endif
}

/* The parent's end of the go pipe closed: it died (no one else holds that end). */
static int parent_gone(int go_r)
{
	struct pollfd pfd = {.fd = go_r, .events = POLLIN};
	return poll(&pfd, 1, 0) < 0 || (pfd.revents & (POLLHUP | POLLERR));
}

CHILD_NORETURN static void child_exec(const struct child_plan *p)
{
	const struct sbx_spawn_req *req = p->req;
	int err_fd = p->err_w;

	/* The parent blocked every signal around the clone, so no inherited handler can have run
	 * here. Reset every disposition (SIG_IGN survives execve; Python ignores SIGPIPE), then
	 * unblock. sigaction fails harmlessly for SIGKILL/SIGSTOP. */
	for (int sig = 1; sig < NSIG; sig++)
		if (sigaction(sig, &p->dfl, NULL) < 0 && sig != SIGKILL && sig != SIGSTOP)
			reset_reserved_signal(sig);
	if (sigprocmask(SIG_SETMASK, &p->empty, NULL) < 0)
		child_fail(err_fd, STEP_SIGMASK, errno);

	/* Die with the parent. If it already died, PDEATHSIG will never fire: give up. From inside a
	 * new PID namespace getppid() cannot tell (it is 0): the go pipe's hang-up can. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
		child_fail(err_fd, STEP_PDEATHSIG, errno);
	if (!p->new_pid_ns && getppid() != p->parent)
		_exit(127);
	close(p->go_w);
	if (parent_gone(p->go_r))
		_exit(127);

	/* Into its own cgroup before anything else, so that QEMU never runs a single instruction
	 * outside it; done here rather than by the parent, which would wait on cgroupfs. Before the
	 * mounts below make /sys/fs/cgroup read-only. */
	if (req->jail && req->jail->enabled && req->jail->cg.version) {
		const char *what = "cgroup";
		int crc = sbx_jail_enter_cgroup(req->jail, &what);
		if (crc < 0)
			child_warn(err_fd, STEP_CGROUP, -crc, what);
	}

	/* The jail's privileged steps (mounts, rlimits, user) while still root. */
	if (req->jail && req->jail->enabled) {
		const char *what = "jail";
		int jrc = sbx_jail_enter_privileged(req->jail, &what);
		if (jrc < 0)
			child_fail_what(err_fd, STEP_JAIL, -jrc, what);
		if (jrc == 1) {
			/* The user switch cleared PDEATHSIG: re-arm it, then make sure the parent did
			 * not die in between. It holds the go pipe's write end until this child has
			 * exec'd, so a hang-up here means it is gone. */
			if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
				child_fail(err_fd, STEP_PDEATHSIG, errno);
			if (parent_gone(p->go_r))
				_exit(127);
		}
	}
	close(p->go_r);

	/* Own process group: a signal to the parent's group (Ctrl-C) does not reach QEMU. */
	if (setpgid(0, 0) < 0)
		child_fail(err_fd, STEP_SETPGID, errno);

	/* Move every source fd above the target range first, so that no dup2 below can
	 * overwrite a source that is still needed (a source may itself be 0..4, e.g. when the
	 * parent runs with stdin closed). */
	int hi_err = fcntl(err_fd, F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD);
	if (hi_err < 0)
		child_fail(err_fd, STEP_DUP, errno);
	err_fd = hi_err;
	int hi_null = fcntl(p->devnull, F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD);
	int hi_chan = fcntl(req->channel_fd, F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD);
	int hi_con = fcntl(req->console_fd, F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD);
	int hi_qmp = req->with_qmp
			     ? fcntl(req->qmp_fd, F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD)
			     : -1;
	int hi_mem = req->with_mem
			     ? fcntl(req->mem_fd, F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD)
			     : -1;
	int hi_net = req->with_net
			     ? fcntl(req->net_fd, F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD)
			     : -1;
	int hi_kernel = req->with_images ? fcntl(req->kernel_fd, F_DUPFD_CLOEXEC,
						    SBX_CHILD_FIRST_CLOSED_FD)
					 : -1;
	int hi_rootfs = req->with_images ? fcntl(req->rootfs_fd, F_DUPFD_CLOEXEC,
						    SBX_CHILD_FIRST_CLOSED_FD)
					 : -1;
	unsigned ndisks = req->with_images ? req->ndisks : 0;
	int hi_disks[SBX_CHILD_DISKS_MAX];
	int disks_ok = 1;
	for (unsigned i = 0; i < ndisks; i++) {
		hi_disks[i] = fcntl(req->disk_fds[i], F_DUPFD_CLOEXEC, SBX_CHILD_FIRST_CLOSED_FD);
		if (hi_disks[i] < 0)
			disks_ok = 0;
	}
	if (hi_null < 0 || hi_chan < 0 || hi_con < 0 || (req->with_qmp && hi_qmp < 0) ||
	    (req->with_mem && hi_mem < 0) || (req->with_net && hi_net < 0) ||
	    (req->with_images && (hi_kernel < 0 || hi_rootfs < 0)) || !disks_ok)
		child_fail(err_fd, STEP_DUP, errno);
	/* dup2 clears FD_CLOEXEC on the target: these survive execve. */
	if (dup2(hi_null, 0) < 0 || dup2(hi_con, 1) < 0 || dup2(hi_con, 2) < 0 ||
	    dup2(hi_chan, SBX_CHILD_CHANNEL_FD) < 0 || dup2(hi_con, SBX_CHILD_CONSOLE_FD) < 0 ||
	    (hi_qmp >= 0 && dup2(hi_qmp, SBX_CHILD_QMP_FD) < 0) ||
	    (hi_mem >= 0 && dup2(hi_mem, SBX_CHILD_MEM_FD) < 0) ||
	    (hi_net >= 0 && dup2(hi_net, SBX_CHILD_NET_FD) < 0) ||
	    (hi_kernel >= 0 && dup2(hi_kernel, SBX_CHILD_KERNEL_FD) < 0) ||
	    (hi_rootfs >= 0 && dup2(hi_rootfs, SBX_CHILD_ROOTFS_FD) < 0))
		child_fail(err_fd, STEP_DUP2, errno);
	for (unsigned i = 0; i < ndisks; i++)
		if (dup2(hi_disks[i], SBX_CHILD_DISK_FD_BASE + (int)i) < 0)
			child_fail(err_fd, STEP_DUP2, errno);

	/* Close everything else except the error pipe (CLOEXEC: execve closes it). Without a QMP
	 * socket, fd 5 is closed too, without a RAM file fd 6, without a network port fd 7,
	 * without images fds 8-9, and the disk fds beyond the last disk's. */
	if ((hi_qmp < 0 && close_from(SBX_CHILD_QMP_FD, SBX_CHILD_QMP_FD, p->max_fd) < 0) ||
	    (hi_mem < 0 && close_from(SBX_CHILD_MEM_FD, SBX_CHILD_MEM_FD, p->max_fd) < 0) ||
	    (hi_net < 0 && close_from(SBX_CHILD_NET_FD, SBX_CHILD_NET_FD, p->max_fd) < 0) ||
	    (hi_kernel < 0 && close_from(SBX_CHILD_KERNEL_FD, SBX_CHILD_ROOTFS_FD, p->max_fd) < 0) ||
	    (ndisks < SBX_CHILD_DISKS_MAX &&
	     close_from(SBX_CHILD_DISK_FD_BASE + ndisks, SBX_CHILD_FIRST_CLOSED_FD - 1, p->max_fd) <
		     0) ||
	    close_from(SBX_CHILD_FIRST_CLOSED_FD, (unsigned)hi_err - 1, p->max_fd) < 0 ||
	    close_from((unsigned)hi_err + 1, ~0U, p->max_fd) < 0)
		child_fail(err_fd, STEP_CLOSE, errno);

	/* The jail's last steps (no_new_privs, seccomp): seccomp last, so that nothing after it
	 * but execve needs a call the filter denies. */
	if (req->jail && req->jail->enabled) {
		const char *what = "jail";
		int jrc = sbx_jail_enter_final(req->jail, &what);
		if (jrc < 0)
			child_fail_what(err_fd, STEP_JAIL, -jrc, what);
	}
	/* No setuid/file-capability gains through execve, for QEMU and anything it runs. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		child_fail(err_fd, STEP_NO_NEW_PRIVS, errno);

	execve(req->path, req->argv, req->envp);
	child_fail(err_fd, STEP_EXECVE, errno);
}

CHILD_NORETURN static int child_main(void *arg)
{
	child_exec(arg);
}

/* The child's stack: its own, since it shares the parent's memory. make_root and child_exec
 * keep a few KiB of locals; the guard page below turns an overflow into a fault, not a write
 * into the parent's memory. */
#define CHILD_STACK_BYTES (256u << 10)
#define CHILD_GUARD_BYTES 4096u

/* clone(CLONE_VM | CLONE_VFORK): the child runs in this process's memory, not a copy of it, and
 * this thread waits until the child's execve (or its exit) releases that memory. A fork() would
 * copy the page tables of a process that may hold gigabytes (milliseconds with the memory map
 * locked, so the event loop's thread waits on its next page fault) and then make each page the
 * other threads write until the exec a copy-on-write fault, charged to them. Only this thread
 * waits, for the jail steps; the others run on.
 *
 * Into a new PID namespace when the jail asks for namespaces: then the child is PID 1 of it,
 * which a later unshare could not give it without a second fork (and the parent would then hold
 * the wrong pid). The child unshares the other namespaces itself (sbx_ns_setup_child), so what
 * the kernel takes to make them is the child's time. A kernel or host that refuses the PID
 * namespace (no privilege, a seccomp'd container) gets a plain clone and a recorded reason.
 * Returns the child's pid, or -1 with errno. */
static pid_t spawn_clone(struct sbx_jail *jail, struct child_plan *plan)
{
	size_t size = CHILD_STACK_BYTES + CHILD_GUARD_BYTES;
	char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
			   -1, 0);
	if (stack == MAP_FAILED)
		return -1;
	if (mprotect(stack, CHILD_GUARD_BYTES, PROT_NONE) < 0) {
		int saved = errno;
		munmap(stack, size);
		errno = saved;
		return -1;
	}
	UNPOISON(stack, size);
	char *top = stack + size; /* stacks grow down on every architecture this builds for */
	int flags = CLONE_VM | CLONE_VFORK | SIGCHLD;
	pid_t pid = -1;
	if (jail && jail->enabled && (jail->clone_flags & CLONE_NEWPID)) {
		plan->new_pid_ns = 1;
		if (FORCED(refuse_namespaces))
			errno = EPERM;
		else
			pid = clone(child_main, top, flags | CLONE_NEWPID, plan);
		if (pid < 0 && (errno == EPERM || errno == EINVAL || errno == EUSERS ||
				errno == ENOSPC || errno == EACCES)) {
			sbx_jail_namespaces_refused(jail, errno);
			plan->new_pid_ns = 0;
		}
	}
	if (!plan->new_pid_ns)
		pid = clone(child_main, top, flags, plan);
	int saved = errno;
	munmap(stack, size); /* the child has exec'd or exited: its stack is unused */
	errno = saved;
	return pid;
}

int sbx_spawn_start(const struct sbx_spawn_req *req, struct sbx_child *out,
		    struct sbx_spawn_pending *pending, struct sbx_err *err)
{
	struct child_plan plan = {.req = req};
	int pipefd[2];

	out->pid = -1;
	out->pidfd = -1;
	pending->err_fd = -1;
	pending->go_fd = -1;
	pending->jail = NULL;
	if (req->channel_fd < 0 || req->console_fd < 0 || (req->with_qmp && req->qmp_fd < 0) ||
	    (req->with_net && req->net_fd < 0) ||
	    (req->with_images && (req->kernel_fd < 0 || req->rootfs_fd < 0)) || !req->path ||
	    !req->argv || !req->envp) {
		return sbx_err_sys(err, -EBADF, "spawn");
	}
	if (req->with_images && req->ndisks > SBX_CHILD_DISKS_MAX)
		return sbx_err_set(err, -EINVAL, "at most %d disks", SBX_CHILD_DISKS_MAX);
	for (unsigned i = 0; req->with_images && i < req->ndisks; i++)
		if (req->disk_fds[i] < 0)
			return sbx_err_sys(err, -EBADF, "spawn");

	_cleanup_close_ int devnull = open("/dev/null", O_RDWR | O_CLOEXEC | O_NOCTTY);
	if (devnull < 0) {
		return sbx_err_sys(err, -errno, "open(/dev/null)");
	}
	/* The parent's end is non-blocking: sbx_spawn_finish polls it (the child never reads it). */
	if (pipe2(pipefd, O_CLOEXEC) < 0 || fcntl(pipefd[0], F_SETFL, O_NONBLOCK) < 0) {
		return sbx_err_sys(err, -errno, "pipe2");
	}
	_cleanup_close_ int err_r = pipefd[0];
	_cleanup_close_ int err_w = pipefd[1];
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		return sbx_err_sys(err, -errno, "pipe2");
	}
	_cleanup_close_ int go_r = pipefd[0];
	_cleanup_close_ int go_w = pipefd[1];

	struct rlimit rl;
	plan.max_fd = 65535;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		plan.max_fd = rl.rlim_cur > (1u << 20) ? (1u << 20) : (unsigned)rl.rlim_cur;
	plan.devnull = devnull;
	plan.err_w = err_w;
	plan.go_r = go_r;
	plan.go_w = go_w;
	plan.parent = getpid();
	memset(&plan.dfl, 0, sizeof(plan.dfl));
	plan.dfl.sa_handler = SIG_DFL;
	sigemptyset(&plan.dfl.sa_mask);
	sigemptyset(&plan.empty);

	/* Block every signal across the clone so that no handler of this process (e.g. Python's,
	 * which writes to the asyncio wakeup fd) runs in the child before it resets them. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid_t pid = spawn_clone(req->jail, &plan);
	int clone_errno = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (pid < 0) {
		return sbx_err_sys(err, -clone_errno, "clone");
	}
	_cleanup_child_ pid_t child = pid;
	sbx_close_fd(&go_r);

	/* A pidfd refers to this child whether it is still starting, running or already a zombie. */
	int pidfd = sbx_pidfd_open(child);
	if (pidfd < 0 && pidfd != -ENOSYS) {
		return sbx_err_sys(err, pidfd, "pidfd_open");
	}
	/* Until execve the child holds the only write end of the error pipe: EOF on err_r means it
	 * exec'd. go_w stays open until then too (the child's check after a user switch). */
	sbx_close_fd(&err_w);
	out->pidfd = pidfd < 0 ? -1 : pidfd;
	out->pid = child;
	child = -1;
	pending->err_fd = TAKE_FD(err_r);
	pending->go_fd = TAKE_FD(go_w);
	pending->jail = req->jail;
	return 0;
}

void sbx_spawn_pending_close(struct sbx_spawn_pending *p)
{
	sbx_close_fd(&p->err_fd);
	sbx_close_fd(&p->go_fd);
}

int sbx_spawn_finish(struct sbx_spawn_pending *p, int blocking, struct sbx_err *err)
{
	if (p->err_fd < 0) {
		return sbx_err_sys(err, -EBADF, "spawn");
	}
	struct child_report rep;
	ssize_t n;
	for (;;) {
		/* The report is smaller than PIPE_BUF: it arrives whole or not at all. */
		n = read(p->err_fd, &rep, sizeof(rep));
		if (n == (ssize_t)sizeof(rep) && !rep.fatal) {
			/* A layer the child went without: record it, then wait for the rest. */
			if (p->jail && rep.step == STEP_CGROUP)
				sbx_jail_cgroup_failed(p->jail, rep.err > 0 ? rep.err : EIO, rep.what);
			continue;
		}
		if (n >= 0)
			break;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN) {
			int saved = errno;
			sbx_spawn_pending_close(p);
			return sbx_err_sys(err, -saved, "read(error pipe)");
		}
		if (!blocking)
			return 0;
		struct pollfd pfd = {.fd = p->err_fd, .events = POLLIN};
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
			int saved = errno;
			sbx_spawn_pending_close(p);
			return sbx_err_sys(err, -saved, "poll(error pipe)");
		}
	}
	sbx_spawn_pending_close(p);
	if (n == 0)
		return 1; /* exec'd */
	if ((size_t)n != sizeof(rep))
		return sbx_err_sys(err, -EIO, "read(error pipe)");
	/* The child's step (a string literal: the same address in this copy of the program). */
	const char *step = rep.step >= 0 && rep.step < STEP__COUNT ? step_names[rep.step] : "spawn";
	if (rep.step == STEP_JAIL && rep.what)
		step = rep.what;
	return sbx_err_sys(err, rep.err > 0 ? -rep.err : -EIO, "%s", step);
}

int sbx_spawn(const struct sbx_spawn_req *req, struct sbx_child *out, struct sbx_err *err)
{
	struct sbx_spawn_pending pending;
	int rc = sbx_spawn_start(req, out, &pending, err);
	if (rc < 0)
		return rc;
	rc = sbx_spawn_finish(&pending, 1, err);
	if (rc == 1)
		return 0;
	/* The child failed before its exec (it exits by itself) or could not be watched. */
	_cleanup_child_ pid_t child = out->pid;
	sbx_close_fd(&out->pidfd);
	out->pid = -1;
	return rc;
}

int sbx_pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
	if (FORCED(no_pidfd))
		return -ENOSYS;
	long fd = syscall(SYS_pidfd_open, pid, 0);
	if (fd < 0)
		return -errno;
	/* pidfds are always close-on-exec. */
	return (int)fd;
#else
	(void)pid;
	return -ENOSYS;
#endif
}

int sbx_child_signal(const struct sbx_child *c, int sig)
{
	if (c->pid <= 0)
		return -ESRCH;
#ifdef SYS_pidfd_send_signal
	if (c->pidfd >= 0) {
		if (syscall(SYS_pidfd_send_signal, c->pidfd, sig, NULL, 0) == 0)
			return 0;
		if (errno != ENOSYS)
			return -errno;
	}
#endif
	return kill(c->pid, sig) == 0 ? 0 : -errno;
}

static int siginfo_to_status(const siginfo_t *si)
{
	switch (si->si_code) {
	case CLD_EXITED:
		return (si->si_status & 0xff) << 8;
	case CLD_KILLED:
		return si->si_status & 0x7f;
	case CLD_DUMPED:
		return (si->si_status & 0x7f) | 0x80;
	default:
		return 0;
	}
}

int sbx_child_wait(const struct sbx_child *c, int blocking, int *status)
{
	if (c->pid <= 0)
		return -ECHILD;
	if (c->pidfd >= 0) {
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		int rc;
		do {
			if (FORCED(no_waitid_pidfd)) {
				rc = -1;
				errno = EINVAL;
			} else {
				rc = waitid(SBX_P_PIDFD, (id_t)c->pidfd, &si,
					    WEXITED | (blocking ? 0 : WNOHANG));
			}
		} while (rc < 0 && errno == EINTR);
		if (rc == 0) {
			if (si.si_pid == 0)
				return 0;
			*status = siginfo_to_status(&si);
			return 1;
		}
		if (errno != EINVAL) /* EINVAL: kernel < 5.4 has no P_PIDFD */
			return -errno;
	}
	int st = 0;
	pid_t r;
	while ((r = waitpid(c->pid, &st, blocking ? 0 : WNOHANG)) < 0 && errno == EINTR)
		;
	if (r < 0)
		return -errno;
	if (r == 0)
		return 0;
	*status = st;
	return 1;
}

int sbx_status_to_returncode(int status)
{
	if (WIFSIGNALED(status))
		return -WTERMSIG(status);
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 0;
}
