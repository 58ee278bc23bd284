/* The deny-list itself: see seccomp_policy.h. A rule is here because QEMU running a microVM
 * (system emulation, no migration, no network back-end in this process, no host devices) has no
 * use for it, while a compromised QEMU could use it to reach the host kernel or other processes. */
#define _GNU_SOURCE 1
#include "seccomp_policy.h"

#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

/* Namespace flags of clone(2)/unshare(2): creating namespaces is how many kernel privilege
 * escalations start (user namespaces especially); QEMU creates none. */
#define NS_FLAGS                                                                                   \
	((uint64_t)(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |    \
		    CLONE_NEWNET | CLONE_NEWCGROUP))

#include <errno.h>

#define DENY(name, why) {name, SBX_ARG_ANY, 0, 0, 0, EPERM, why}

const struct sbx_seccomp_rule sbx_seccomp_rules[] = {
	/* Other processes */
	DENY("ptrace", "inspecting or controlling other processes; QEMU debugs nothing"),
	DENY("process_vm_readv", "reading another process's memory"),
	DENY("process_vm_writev", "writing another process's memory"),
	DENY("kcmp", "comparing other processes' kernel objects (information leak)"),
	DENY("pidfd_getfd", "stealing file descriptors from another process"),

	/* The kernel itself */
	DENY("kexec_load", "replacing the running host kernel"),
	DENY("kexec_file_load", "replacing the running host kernel"),
	DENY("init_module", "loading kernel code"),
	DENY("finit_module", "loading kernel code"),
	DENY("delete_module", "unloading kernel modules"),
	DENY("bpf", "eBPF programs run in the host kernel: a large attack surface"),
	DENY("perf_event_open", "performance counters leak host timing and have a history of bugs"),
	DENY("lookup_dcookie", "kernel profiling interface, unused"),
	DENY("syslog", "reading or clearing the host's kernel log"),
	DENY("iopl", "direct access to I/O ports of the host"),
	DENY("ioperm", "direct access to I/O ports of the host"),
	DENY("reboot", "rebooting the host; the guest's reboot is handled inside QEMU"),
	DENY("vhangup", "hanging up the host's terminal"),
	DENY("userfaultfd", "only for post-copy migration, a common exploit primitive for races"),
	DENY("personality", "changing the execution domain (e.g. READ_IMPLIES_EXEC)"),

	/* File systems and the mount table */
	DENY("mount", "changing the mount table"),
	DENY("umount2", "changing the mount table"),
	DENY("pivot_root", "changing the root file system"),
	DENY("chroot", "changing the root directory"),
	DENY("move_mount", "changing the mount table (new mount API)"),
	DENY("open_tree", "cloning mount trees (new mount API)"),
	DENY("fsopen", "creating file system contexts (new mount API)"),
	DENY("fsmount", "creating mounts (new mount API)"),
	DENY("fsconfig", "configuring file system contexts (new mount API)"),
	DENY("mount_setattr", "changing mount attributes"),
	DENY("swapon", "adding host swap"),
	DENY("swapoff", "removing host swap"),
	DENY("quotactl", "changing disk quotas"),
	DENY("open_by_handle_at", "opening files by handle bypasses path checks (container escapes)"),
	DENY("name_to_handle_at", "pairs with open_by_handle_at"),
	DENY("acct", "switching process accounting on the host"),

	/* Namespaces: the jail set them up before exec; QEMU must not make or join others */
	DENY("setns", "joining another namespace"),
	DENY("unshare", "creating namespaces (user namespaces widen the kernel attack surface)"),
	{"clone", SBX_ARG_MASKED_NE0, 0, NS_FLAGS, 0, EPERM,
	 "threads and processes yes, new namespaces no"},
	{"clone3", SBX_ARG_ANY, 0, 0, 0, ENOSYS,
	 "its flags are in memory, out of seccomp's sight; ENOSYS makes glibc fall back to clone"},

	/* Keys, clocks, terminals */
	DENY("keyctl", "the kernel keyring holds other users' secrets"),
	DENY("add_key", "the kernel keyring"),
	DENY("request_key", "the kernel keyring"),
	DENY("settimeofday", "setting the host clock"),
	DENY("clock_settime", "setting the host clock"),
	DENY("clock_adjtime", "adjusting the host clock"),
	DENY("adjtimex", "adjusting the host clock"),
	{"ioctl", SBX_ARG_EQ, 1, 0, TIOCSTI, EPERM, "injecting input into a terminal"},

	/* Sockets */
	{"socket", SBX_ARG_EQ, 0, 0, AF_PACKET, EPERM, "raw link-layer access to host interfaces"},
};

const size_t sbx_seccomp_rule_count = sizeof(sbx_seccomp_rules) / sizeof(sbx_seccomp_rules[0]);

const char *const sbx_seccomp_policy_names[SBX_SECCOMP__COUNT] = {
	[SBX_SECCOMP_ALLOW_LIST] = "allow-list",
	[SBX_SECCOMP_DENY_LIST] = "deny-list",
	[SBX_SECCOMP_ALLOW_LIST_LOG] = "allow-list (log only)",
};

/* Not listed, on purpose: socket, connect, bind, listen, accept (every socket QEMU uses is handed
 * to it as an fd); io_uring_* (QEMU's AIO falls back to ppoll/epoll on ENOSYS, and io_uring is a
 * large, often exploited kernel surface); unlink, rename, mkdir, chmod, chown, link and every other
 * call that changes the file system; ptrace, process_vm_*, kexec, modules, bpf, perf, keys, mount
 * and namespaces (what the deny-list names) are simply not on the list. */
const struct sbx_seccomp_group sbx_seccomp_allow_groups[] = {
	{"memory",
	 "brk mmap munmap mprotect mremap madvise msync mincore mlock munlock get_mempolicy "
	 "set_mempolicy mbind memfd_create fallocate membarrier",
	 "guest RAM (anonymous or the snapshot's file, whose pages a discard punches out), TCG's "
	 "code buffer (mprotect to executable), the heap; NUMA policy queries of the memory backend"},
	{"threads",
	 "futex set_robust_list get_robust_list rseq set_tid_address gettid exit exit_group "
	 "sched_yield sched_getaffinity",
	 "QEMU's vCPU, RCU, I/O worker and migration threads and their locks (clone: below, without "
	 "namespace flags)"},
	{"signals",
	 "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigtimedwait rt_sigpending sigaltstack "
	 "signalfd4 tgkill tkill restart_syscall",
	 "kicking a vCPU thread out of KVM_RUN or TCG (SIG_IPI), the main loop's signalfd, abort()"},
	{"event loop",
	 "ppoll poll pselect6 select epoll_create1 epoll_ctl epoll_wait epoll_pwait eventfd2 "
	 "timerfd_create timerfd_settime timerfd_gettime",
	 "the main loop and AIO contexts wait on fds; eventfds notify between threads and, under "
	 "KVM, are the ioeventfds and irqfds of virtio queues"},
	{"fd I/O",
	 "read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 lseek close "
	 "fcntl dup dup2 dup3 pipe pipe2 fsync fdatasync",
	 "the disks' reads and a writable disk's writes and flushes (a thread pool of preadv and "
	 "pwritev, fdatasync), the chardevs, migration streams to and from the pipe the host hands "
	 "over QMP"},
	{"sockets handed over as fds",
	 "recvmsg sendmsg recvfrom sendto getsockopt setsockopt getsockname getpeername shutdown",
	 "the agent channel, console, QMP monitor (getfd: an fd in SCM_RIGHTS) and network port are "
	 "socketpairs the host made; QEMU creates no socket"},
	{"files in the jail's root",
	 "openat open access faccessat faccessat2 stat lstat fstat newfstatat statx statfs fstatfs "
	 "readlink readlinkat getdents64 getcwd chdir fchdir fadvise64",
	 "the binary's libraries, its TCG module and firmware, and the images and RAM file at "
	 "/proc/self/fd/N: the only files in its root, all read-only (but a writable disk, reopened "
	 "through its fd)"},
	{"time",
	 "clock_gettime clock_getres gettimeofday time clock_nanosleep nanosleep",
	 "guest clocks and timers (the vDSO answers most; the syscall when it cannot)"},
	{"process facts",
	 "getpid getppid getuid geteuid getgid getegid getresuid getresgid getgroups uname sysinfo "
	 "getrlimit prlimit64 getrusage times arch_prctl prctl getrandom getpriority",
	 "glibc and glib start-up, thread names (prctl PR_SET_NAME), QEMU's own random numbers"},
	{"start",
	 "execve seccomp",
	 "the jail's own exec into QEMU (nothing else in the root could be run, and QEMU's -sandbox "
	 "spawn=deny refuses it afterwards); QEMU's -sandbox filter stacks on top of this one"},
};

const size_t sbx_seccomp_allow_group_count =
	sizeof(sbx_seccomp_allow_groups) / sizeof(sbx_seccomp_allow_groups[0]);

const char sbx_seccomp_refused_on_purpose[] =
	"clone3 io_uring_setup io_uring_enter io_uring_register";
const char sbx_seccomp_refused_on_purpose_reason[] =
	"measured, and refused all the same: glibc falls back from clone3 to clone (whose flags the "
	"filter can check), QEMU's AIO from io_uring to ppoll/epoll (io_uring is a large, often "
	"exploited kernel surface)";

/* KVMIO, the type byte of every /dev/kvm, VM and vCPU ioctl (linux/kvm.h). */
#define SBX_KVMIO 0xAEu

const struct sbx_seccomp_rule sbx_seccomp_allow_args[] = {
	{"clone", SBX_ARG_MASKED_EQ, 0, NS_FLAGS, 0, 0,
	 "threads (and nothing else: QEMU forks nothing) without namespace flags; clone3 is not "
	 "listed (its flags are in memory), so glibc falls back to clone"},
	{"ioctl", SBX_ARG_MASKED_EQ, 1, 0xff00u, SBX_KVMIO << 8, 0,
	 "KVM's ioctls only (type KVMIO: /dev/kvm, the VM and its vCPUs, KVM_RUN); under TCG QEMU "
	 "makes none on the product's paths, so no terminal or block ioctl (TIOCSTI) passes"},
};

const size_t sbx_seccomp_allow_arg_count =
	sizeof(sbx_seccomp_allow_args) / sizeof(sbx_seccomp_allow_args[0]);
