/* The host-side seccomp policies for QEMU, as data: an allow-list of syscall groups (the default)
 * and the older deny-list (the fallback), one reason per group or rule.
 * seccomp.c turns it into a BPF program with libseccomp; tests/c/test_seccomp.c checks it as a
 * table of (syscall, arguments) -> action against the exported BPF. */
#ifndef SBX_SECCOMP_POLICY_H
#define SBX_SECCOMP_POLICY_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* An optional condition on one argument: the rule applies when (arg[index] & mask) op value. */
enum sbx_arg_op {
	SBX_ARG_ANY = 0,     /* no condition: the rule applies to every call */
	SBX_ARG_EQ,          /* arg == value (mask ignored) */
	SBX_ARG_MASKED_NE0,  /* (arg & mask) != 0, i.e. any of these bits set */
	SBX_ARG_MASKED_EQ,   /* (arg & mask) == value */
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

/* Which policy a jail loads. The allow-list is the default; the deny-list above is the fallback
 * for a QEMU the allow-list was not measured on (vm/jail.py decides, with a warning). */
enum sbx_seccomp_policy {
	SBX_SECCOMP_ALLOW_LIST = 0,
	SBX_SECCOMP_DENY_LIST,
	/* The allow-list, but a call outside it is logged (kernel audit log, type 1326) and let
	 * through instead of refused: how the list is measured against a new QEMU. */
	SBX_SECCOMP_ALLOW_LIST_LOG,
	SBX_SECCOMP__COUNT,
};

extern const char *const sbx_seccomp_policy_names[SBX_SECCOMP__COUNT];

/* The allow-list: every call QEMU was measured to make on the product's paths (TCG boot and
 * runs, L1 templates and clones, paused and forked sessions, package layers, the network port;
 * KVM from QEMU's source and the KVM probe), in groups, one reason per group. Anything else fails
 * with SBX_SECCOMP_ALLOW_LIST_ERRNO. */
struct sbx_seccomp_group {
	const char *name;
	const char *syscalls; /* space-separated names as libseccomp knows them; a name this
			       * architecture lacks is skipped */
	const char *reason;
};
extern const struct sbx_seccomp_group sbx_seccomp_allow_groups[];
extern const size_t sbx_seccomp_allow_group_count;
/* Calls QEMU makes that the allow-list refuses on purpose (QEMU and libc fall back on ENOSYS):
 * space-separated, with the reason. In log mode they are refused as in the allow-list, silently,
 * so that the log holds only calls the list lacks. */
extern const char sbx_seccomp_refused_on_purpose[];
extern const char sbx_seccomp_refused_on_purpose_reason[];
/* Calls the allow-list admits only with certain arguments (op as above: the call is allowed
 * when the condition holds; error unused). */
extern const struct sbx_seccomp_rule sbx_seccomp_allow_args[];
extern const size_t sbx_seccomp_allow_arg_count;
/* ENOSYS, not EPERM: glibc and glib take ENOSYS as "this kernel lacks the call" and fall back to
 * an older one (clone3 -> clone, faccessat2 -> faccessat, io_uring -> ppoll), which a QEMU or libc
 * newer than the measurement is likely to need; EPERM would end those paths in errors. */
#define SBX_SECCOMP_ALLOW_LIST_ERRNO ENOSYS

#endif /* SBX_SECCOMP_POLICY_H */
