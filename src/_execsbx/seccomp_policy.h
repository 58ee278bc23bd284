/* The host-side seccomp policy for QEMU, as data: one rule per line, one reason per rule.
 * seccomp.c turns it into a BPF program with libseccomp; tests/c/test_seccomp.c checks it as a
 * table of (syscall, arguments) -> action against the exported BPF. */
#ifndef SBX_SECCOMP_POLICY_H
#define SBX_SECCOMP_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* An optional condition on one argument: the rule applies when (arg[index] & mask) op value. */
enum sbx_arg_op {
	SBX_ARG_ANY = 0,     /* no condition: the rule applies to every call */
	SBX_ARG_EQ,          /* arg == value (mask ignored) */
	SBX_ARG_MASKED_NE0,  /* (arg & mask) != 0, i.e. any of these bits set */
};

struct sbx_seccomp_rule {
	const char *syscall; /* name as libseccomp knows it (resolved per architecture) */
	enum sbx_arg_op op;
	unsigned arg_index;
	uint64_t mask;
	uint64_t value;
	int error;          /* the errno the call fails with */
	const char *reason; /* why QEMU never needs this: shown by `sbx doctor --verbose`, docs */
};

/* Nearly every rule answers EPERM: a denied call fails like an unprivileged one, which QEMU's error paths
 * handle, instead of killing the VM in the middle of a run. Everything not listed is allowed:
 * QEMU's own -sandbox filter (an allow-list of its own) stacks on top after exec. */
extern const struct sbx_seccomp_rule sbx_seccomp_rules[];
extern const size_t sbx_seccomp_rule_count;

#endif /* SBX_SECCOMP_POLICY_H */
