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
