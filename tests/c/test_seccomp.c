/* The host seccomp policies (the deny-list, then the allow-list), tested two ways without QEMU:
 *   1. as a table of (syscall, arguments) -> action, evaluated against the BPF program that
 *      sbx_seccomp_build exports, by the small classic-BPF interpreter below;
 *   2. in a probe process that loads the same filter and makes the denied calls for real. */
#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <seccomp.h>

#include "seccomp_filter.h"
#include "seccomp_policy.h"
#include "test.h"

#define BAD_INSN 0xdeadbeefu

/* Classic BPF as seccomp runs it: input is struct seccomp_data, A and X registers, 16 scratch
 * words. Returns the filter's return value, or BAD_INSN for anything it does not know. */
static uint32_t run_bpf(const struct sbx_bpf *p, const struct seccomp_data *d)
{
	uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = {0};
	const uint8_t *in = (const uint8_t *)d;
	for (unsigned pc = 0; pc < p->len; pc++) {
		const struct sock_filter *f = &p->insns[pc];
		uint32_t k = f->k;
		uint32_t src = BPF_SRC(f->code) == BPF_X ? x : k;
		switch (BPF_CLASS(f->code)) {
		case BPF_LD:
			if (f->code == (BPF_LD | BPF_W | BPF_ABS)) {
				if (k % 4 || k + 4 > sizeof(*d))
					return BAD_INSN;
				memcpy(&a, in + k, 4);
			} else if (f->code == (BPF_LD | BPF_IMM)) {
				a = k;
			} else if (f->code == (BPF_LD | BPF_MEM) && k < BPF_MEMWORDS) {
				a = mem[k];
			} else {
				return BAD_INSN;
			}
			break;
		case BPF_LDX:
			if (f->code == (BPF_LDX | BPF_IMM))
				x = k;
			else if (f->code == (BPF_LDX | BPF_MEM) && k < BPF_MEMWORDS)
				x = mem[k];
			else
				return BAD_INSN;
			break;
		case BPF_ST:
			if (k >= BPF_MEMWORDS)
				return BAD_INSN;
			mem[k] = a;
			break;
		case BPF_STX:
			if (k >= BPF_MEMWORDS)
				return BAD_INSN;
			mem[k] = x;
			break;
		case BPF_ALU:
			switch (BPF_OP(f->code)) {
			case BPF_AND: a &= src; break;
			case BPF_OR: a |= src; break;
			case BPF_ADD: a += src; break;
			case BPF_SUB: a -= src; break;
			case BPF_RSH: a >>= src; break;
			case BPF_LSH: a <<= src; break;
			default: return BAD_INSN;
			}
			break;
		case BPF_JMP: {
			int taken;
			switch (BPF_OP(f->code)) {
			case BPF_JA: pc += k; continue;
			case BPF_JEQ: taken = a == src; break;
			case BPF_JGT: taken = a > src; break;
			case BPF_JGE: taken = a >= src; break;
			case BPF_JSET: taken = (a & src) != 0; break;
			default: return BAD_INSN;
			}
			pc += taken ? f->jt : f->jf;
			break;
		}
		case BPF_RET:
			return BPF_RVAL(f->code) == BPF_A ? a : k;
		case BPF_MISC:
			if (f->code == (BPF_MISC | BPF_TAX))
				x = a;
			else if (f->code == (BPF_MISC | BPF_TXA))
				a = x;
			else
				return BAD_INSN;
			break;
		default:
			return BAD_INSN;
		}
	}
	return BAD_INSN; /* fell off the end: the kernel would reject the program */
}

static struct sbx_bpf BPF;

static uint32_t action(const char *name, uint32_t arch, uint64_t a0, uint64_t a1)
{
	struct seccomp_data d = {.nr = seccomp_syscall_resolve_name(name), .arch = arch};
	d.args[0] = a0;
	d.args[1] = a1;
	return run_bpf(&BPF, &d);
}

#define DENIED(e) (SECCOMP_RET_ERRNO | (uint32_t)(e))

static void test_build(void)
{
	struct sbx_err why = {0};
	CHECK_EQ(sbx_seccomp_build(&BPF, &why), 0);
	CHECK(BPF.len > 10);
}

/* The table: each row one (syscall, arguments) and the action the policy must give it. */
static void test_policy_table(void)
{
	const uint32_t native = AUDIT_ARCH_X86_64;
	static const struct {
		const char *name;
		uint64_t a0, a1;
		uint32_t expect;
	} rows[] = {
		{"ptrace", 0, 0, DENIED(EPERM)},
		{"process_vm_readv", 1, 0, DENIED(EPERM)},
		{"mount", 0, 0, DENIED(EPERM)},
		{"init_module", 0, 0, DENIED(EPERM)},
		{"kexec_load", 0, 0, DENIED(EPERM)},
		{"bpf", 0, 0, DENIED(EPERM)},
		{"unshare", CLONE_NEWUSER, 0, DENIED(EPERM)},
		{"setns", 3, 0, DENIED(EPERM)},
		{"keyctl", 0, 0, DENIED(EPERM)},
		{"userfaultfd", 0, 0, DENIED(EPERM)},
		{"clone3", 0, 0, DENIED(ENOSYS)},
		/* clone: threads and plain forks pass, any namespace flag does not */
		{"clone", CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
				  CLONE_SYSVSEM | CLONE_SETTLS | CLONE_PARENT_SETTID |
				  CLONE_CHILD_CLEARTID,
		 0, SECCOMP_RET_ALLOW},
		{"clone", SIGCHLD, 0, SECCOMP_RET_ALLOW},
		{"clone", CLONE_NEWUSER | SIGCHLD, 0, DENIED(EPERM)},
		{"clone", CLONE_NEWNET, 0, DENIED(EPERM)},
		{"clone", CLONE_NEWNS | CLONE_NEWPID, 0, DENIED(EPERM)},
		/* ioctl: only TIOCSTI */
		{"ioctl", 0, TIOCSTI, DENIED(EPERM)},
		{"ioctl", 0, TCGETS, SECCOMP_RET_ALLOW},
		{"ioctl", 0, 0xAE01 /* KVM_CREATE_VM */, SECCOMP_RET_ALLOW},
		/* socket: AF_PACKET only */
		{"socket", AF_PACKET, SOCK_RAW, DENIED(EPERM)},
		{"socket", AF_UNIX, SOCK_STREAM, SECCOMP_RET_ALLOW},
		{"socket", AF_INET, SOCK_STREAM, SECCOMP_RET_ALLOW},
		/* what QEMU does all day */
		{"read", 0, 0, SECCOMP_RET_ALLOW},
		{"ppoll", 0, 0, SECCOMP_RET_ALLOW},
		{"mmap", 0, 0, SECCOMP_RET_ALLOW},
		{"futex", 0, 0, SECCOMP_RET_ALLOW},
		{"seccomp", 1, 0, SECCOMP_RET_ALLOW}, /* QEMU's own -sandbox stacks on top */
		{"execve", 0, 0, SECCOMP_RET_ALLOW},  /* the jail's own exec of QEMU */
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		uint32_t got = action(rows[i].name, native, rows[i].a0, rows[i].a1);
		if (got != rows[i].expect)
			fprintf(stderr, "row %zu: %s(%#llx, %#llx) -> %#x, want %#x\n", i,
				rows[i].name, (unsigned long long)rows[i].a0,
				(unsigned long long)rows[i].a1, got, rows[i].expect);
		CHECK_EQ(got, rows[i].expect);
	}
}

/* Every unconditional rule of the policy data is in the program, with its errno. */
static void test_every_rule_is_compiled(void)
{
	for (size_t i = 0; i < sbx_seccomp_rule_count; i++) {
		const struct sbx_seccomp_rule *r = &sbx_seccomp_rules[i];
		CHECK(r->reason && r->reason[0]);
		if (r->op != SBX_ARG_ANY || seccomp_syscall_resolve_name(r->syscall) < 0)
			continue;
		uint32_t got = action(r->syscall, AUDIT_ARCH_X86_64, 0, 0);
		if (got != DENIED(r->error))
			fprintf(stderr, "rule %s -> %#x\n", r->syscall, got);
		CHECK_EQ(got, DENIED(r->error));
	}
}

/* A call through the 32-bit ABI would dodge every rule (other syscall numbers): it is killed. */
static void test_foreign_arch_is_killed(void)
{
	uint32_t got = action("getpid", AUDIT_ARCH_I386, 0, 0);
	CHECK(got == SECCOMP_RET_KILL_PROCESS || got == SECCOMP_RET_KILL_THREAD);
}

/* A probe process under the real filter: each denied call fails with the policy's errno, where
 * without the filter it would succeed or fail differently (checked in the parent first). */
static void test_probe_process(void)
{
	pid_t pid = fork();
	if (pid == 0) {
		int bad = 0;
		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || sbx_seccomp_load(&BPF) < 0)
			_exit(100);
		/* unfiltered: 0 (root may create user namespaces) */
		if (unshare(CLONE_NEWUSER) == 0 || errno != EPERM)
			bad |= 1;
		/* unfiltered: ENOENT (no such mount point) */
		if (mount("none", "/nonexistent-sbx-probe", "tmpfs", 0, NULL) == 0 || errno != EPERM)
			bad |= 2;
		/* unfiltered: 0 */
		if (syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0) == 0 || errno != EPERM)
			bad |= 4;
		if (syscall(SYS_keyctl, 0, 0, 0, 0, 0) == 0 || errno != EPERM)
			bad |= 8;
		if (syscall(SYS_clone3, NULL, 0) == 0 || errno != ENOSYS)
			bad |= 16;
		/* allowed calls still work */
		if (getpid() <= 0)
			bad |= 32;
		int s = socket(AF_UNIX, SOCK_STREAM, 0);
		if (s < 0)
			bad |= 64;
		_exit(bad);
	}
	CHECK(pid > 0);
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st));
	if (WEXITSTATUS(st))
		fprintf(stderr, "probe failures: %#x\n", WEXITSTATUS(st));
	CHECK_EQ(WEXITSTATUS(st), 0);
}

/* The same calls unfiltered behave differently, so the probe above tests the filter. */
static void test_probe_baseline(void)
{
	errno = 0;
	CHECK(mount("none", "/nonexistent-sbx-probe", "tmpfs", 0, NULL) < 0 && errno == ENOENT);
	pid_t pid = fork();
	if (pid == 0)
		_exit(syscall(SYS_ptrace, 0, 0, 0, 0) == 0 ? 0 : 1);
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static struct sbx_bpf ALLOW;
#define REFUSED DENIED(SBX_SECCOMP_ALLOW_LIST_ERRNO)

static uint32_t allow_action(const char *name, uint64_t a0, uint64_t a1)
{
	struct seccomp_data d = {.nr = seccomp_syscall_resolve_name(name),
				 .arch = AUDIT_ARCH_X86_64};
	d.args[0] = a0;
	d.args[1] = a1;
	return run_bpf(&ALLOW, &d);
}

/* The allow-list as a table: what QEMU does passes, everything else is refused with ENOSYS. */
static void test_allow_list_table(void)
{
	struct sbx_err why = {0};
	CHECK_EQ(sbx_seccomp_build_policy(SBX_SECCOMP_ALLOW_LIST, &ALLOW, &why), 0);
	static const struct {
		const char *name;
		uint64_t a0, a1;
		uint32_t expect;
	} rows[] = {
		{"read", 0, 0, SECCOMP_RET_ALLOW},
		{"ppoll", 0, 0, SECCOMP_RET_ALLOW},
		{"mmap", 0, 0, SECCOMP_RET_ALLOW},
		{"futex", 0, 0, SECCOMP_RET_ALLOW},
		{"recvmsg", 0, 0, SECCOMP_RET_ALLOW},
		{"execve", 0, 0, SECCOMP_RET_ALLOW},
		{"seccomp", 1, 0, SECCOMP_RET_ALLOW},
		{"clone", CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
				  CLONE_SYSVSEM | CLONE_SETTLS | CLONE_PARENT_SETTID |
				  CLONE_CHILD_CLEARTID,
		 0, SECCOMP_RET_ALLOW},
		{"clone", CLONE_NEWUSER | SIGCHLD, 0, REFUSED},
		{"clone", CLONE_NEWNET, 0, REFUSED},
		{"clone3", 0, 0, REFUSED},
		{"ioctl", 0, 0xAE01 /* KVM_CREATE_VM */, SECCOMP_RET_ALLOW},
		{"ioctl", 0, 0xAE80 /* KVM_RUN */, SECCOMP_RET_ALLOW},
		{"ioctl", 0, TIOCSTI, REFUSED},
		{"ioctl", 0, TCGETS, REFUSED},
		{"socket", AF_UNIX, SOCK_STREAM, REFUSED},
		{"socket", AF_PACKET, SOCK_RAW, REFUSED},
		{"connect", 0, 0, REFUSED},
		{"ptrace", 0, 0, REFUSED},
		{"mount", 0, 0, REFUSED},
		{"unshare", 0, 0, REFUSED},
		{"setns", 0, 0, REFUSED},
		{"bpf", 0, 0, REFUSED},
		{"io_uring_setup", 0, 0, REFUSED},
		{"unlinkat", 0, 0, REFUSED},
		{"setuid", 0, 0, REFUSED},
		{"kill", 1, 9, REFUSED},
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		uint32_t got = allow_action(rows[i].name, rows[i].a0, rows[i].a1);
		if (got != rows[i].expect)
			fprintf(stderr, "allow-list row %zu: %s(%#llx, %#llx) -> %#x, want %#x\n", i,
				rows[i].name, (unsigned long long)rows[i].a0,
				(unsigned long long)rows[i].a1, got, rows[i].expect);
		CHECK_EQ(got, rows[i].expect);
	}
	/* every listed call of every group is in the program */
	char name[64];
	for (size_t g = 0; g < sbx_seccomp_allow_group_count; g++) {
		CHECK(sbx_seccomp_allow_groups[g].reason[0]);
		for (const char *p = sbx_seccomp_allow_groups[g].syscalls; *p;) {
			size_t n = strcspn(p, " ");
			memcpy(name, p, n);
			name[n] = 0;
			if (seccomp_syscall_resolve_name(name) >= 0 &&
			    allow_action(name, 0, 0) != SECCOMP_RET_ALLOW) {
				fprintf(stderr, "listed but not allowed: %s\n", name);
				CHECK(0);
			}
			p += n;
			p += strspn(p, " ");
		}
	}
	CHECK(allow_action("getpid", 0, 0) == SECCOMP_RET_ALLOW);
	CHECK(ALLOW.log_refusals);
}

/* Log mode: what the list lacks is logged and let through; the calls refused on purpose are
 * refused as in the allow-list (so that QEMU takes its fallback, as in production), unlogged. */
static void test_log_mode_table(void)
{
	struct sbx_bpf log = {0};
	struct sbx_err why = {0};
	CHECK_EQ(sbx_seccomp_build_policy(SBX_SECCOMP_ALLOW_LIST_LOG, &log, &why), 0);
	CHECK(!log.log_refusals);
	struct sbx_bpf saved = ALLOW;
	ALLOW = log;
	CHECK_EQ(allow_action("read", 0, 0), SECCOMP_RET_ALLOW);
	CHECK_EQ(allow_action("kill", 1, 9), SECCOMP_RET_LOG);
	CHECK_EQ(allow_action("socket", AF_UNIX, SOCK_STREAM), SECCOMP_RET_LOG);
	CHECK_EQ(allow_action("io_uring_setup", 0, 0), REFUSED);
	CHECK_EQ(allow_action("clone3", 0, 0), REFUSED);
	ALLOW = saved;
	sbx_bpf_free(&log);
}

/* A probe process under the allow-list: calls outside it fail with ENOSYS for real, calls on it
 * still work. */
static void test_allow_list_probe_process(void)
{
	pid_t pid = fork();
	if (pid == 0) {
		int bad = 0;
		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || sbx_seccomp_load(&ALLOW) < 0)
			_exit(100);
		/* unfiltered: a socket */
		if (socket(AF_UNIX, SOCK_STREAM, 0) >= 0 || errno != ENOSYS)
			bad |= 1;
		/* unfiltered: 0 */
		if (syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0) == 0 || errno != ENOSYS)
			bad |= 2;
		/* unfiltered: ENOENT */
		if (syscall(SYS_unlinkat, AT_FDCWD, "/nonexistent-sbx-probe", 0) == 0 ||
		    errno != ENOSYS)
			bad |= 4;
		/* a terminal ioctl: not KVM's */
		if (ioctl(0, TCGETS, NULL) == 0 || errno != ENOSYS)
			bad |= 8;
		/* a KVM ioctl passes the filter (and fails on a bad fd) */
		if (ioctl(-1, 0xAE01, 0) == 0 || errno != EBADF)
			bad |= 16;
		if (getpid() <= 0)
			bad |= 32;
		_exit(bad);
	}
	CHECK(pid > 0);
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st));
	if (WEXITSTATUS(st))
		fprintf(stderr, "allow-list probe failures: %#x\n", WEXITSTATUS(st));
	CHECK_EQ(WEXITSTATUS(st), 0);
}

int main(void)
{
	RUN(test_build);
	RUN(test_policy_table);
	RUN(test_every_rule_is_compiled);
	RUN(test_foreign_arch_is_killed);
	RUN(test_probe_process);
	RUN(test_probe_baseline);
	RUN(test_allow_list_table);
	RUN(test_allow_list_probe_process);
	RUN(test_log_mode_table);
	sbx_bpf_free(&BPF);
	sbx_bpf_free(&ALLOW);
	TEST_MAIN_END("test_seccomp");
}
