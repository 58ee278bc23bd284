/* The host seccomp filter for QEMU: built from seccomp_policy.c with libseccomp in the parent
 * (allocation, name resolution), loaded in the child right before execve with one prctl (the only
 * step that runs between clone and exec, and it is async-signal-safe). */
#ifndef SBX_SECCOMP_FILTER_H
#define SBX_SECCOMP_FILTER_H

#include <linux/filter.h>

#include "sbx_err.h"
#include "seccomp_policy.h"

struct sbx_bpf {
	struct sock_filter *insns; /* heap; NULL when empty */
	unsigned short len;        /* instruction count */
	int log_refusals;          /* load with SECCOMP_FILTER_FLAG_LOG (not in log mode, whose
				    * own action logs what the list lacks) */
};

/* Compile the policy into *out for the native architecture. 0, or -errno with err naming the
 * failed step. Syscalls that the architecture does not have are skipped (they cannot be called). */
int sbx_seccomp_build_policy(enum sbx_seccomp_policy policy, struct sbx_bpf *out,
			     struct sbx_err *err);
/* The deny-list's program (sbx_seccomp_build_policy(SBX_SECCOMP_DENY_LIST, ...)). */
int sbx_seccomp_build(struct sbx_bpf *out, struct sbx_err *err);
void sbx_bpf_free(struct sbx_bpf *bpf);
/* The program of sbx_seccomp_build, compiled once per process on first use (thread-safe) and
 * shared by every spawn: the policy is fixed, and compiling it with libseccomp costs about a
 * millisecond that would otherwise be paid per VM, on the caller's event loop. 0 and *out
 * (valid until exit, never to be freed), or the first build's -errno and err, every time. */
int sbx_seccomp_program_for(enum sbx_seccomp_policy policy, const struct sbx_bpf **out,
			    struct sbx_err *err);
/* The deny-list's shared program. */
int sbx_seccomp_program(const struct sbx_bpf **out, struct sbx_err *err);
/* Install the filter on the calling thread (needs no_new_privs or CAP_SYS_ADMIN), with
 * SECCOMP_FILTER_FLAG_LOG when bpf->log_refusals and the kernel has it. 0 or -errno.
 * Async-signal-safe. */
int sbx_seccomp_load(const struct sbx_bpf *bpf);

#endif /* SBX_SECCOMP_FILTER_H */
