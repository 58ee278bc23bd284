/* See seccomp_filter.h. */
#define _GNU_SOURCE 1
#include "seccomp_filter.h"

#include <errno.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cleanup.h"
#include "seccomp_policy.h"

static void release_ctx(scmp_filter_ctx *ctx)
{
	if (*ctx)
		seccomp_release(*ctx);
}

static int add_rule(scmp_filter_ctx ctx, uint32_t action, const struct sbx_seccomp_rule *r, int nr)
{
	switch (r->op) {
	case SBX_ARG_ANY:
		return seccomp_rule_add(ctx, action, nr, 0);
	case SBX_ARG_EQ:
		return seccomp_rule_add(ctx, action, nr, 1,
					SCMP_CMP(r->arg_index, SCMP_CMP_EQ, r->value));
	case SBX_ARG_MASKED_EQ:
		return seccomp_rule_add(ctx, action, nr, 1,
					SCMP_CMP(r->arg_index, SCMP_CMP_MASKED_EQ, r->mask, r->value));
	case SBX_ARG_MASKED_NE0:
		/* BPF compares (arg & mask) == value; "any bit of mask set" is one rule per bit. */
		for (unsigned bit = 0; bit < 64; bit++) {
			uint64_t b = (uint64_t)1 << bit;
			if (!(r->mask & b))
				continue;
			int rc = seccomp_rule_add(ctx, action, nr, 1,
						  SCMP_CMP(r->arg_index, SCMP_CMP_MASKED_EQ, b, b));
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	return -EINVAL;
}

/* The deny-list: allow by default, each rule fails its call with its errno. */
static int add_deny_list(scmp_filter_ctx ctx)
{
	for (size_t i = 0; i < sbx_seccomp_rule_count; i++) {
		const struct sbx_seccomp_rule *r = &sbx_seccomp_rules[i];
		int nr = seccomp_syscall_resolve_name(r->syscall);
		if (nr == __NR_SCMP_ERROR || nr < 0)
			continue; /* not a syscall of this architecture */
		int rc = add_rule(ctx, SCMP_ACT_ERRNO((uint32_t)r->error), r, nr);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* One rule with action for each name of a space-separated list this architecture has. */
static int add_names(scmp_filter_ctx ctx, uint32_t action, const char *p)
{
	char name[64];
	while (*p) {
		size_t n = strcspn(p, " ");
		if (n > 0 && n < sizeof(name)) {
			memcpy(name, p, n);
			name[n] = 0;
			int nr = seccomp_syscall_resolve_name(name);
			if (nr != __NR_SCMP_ERROR && nr >= 0) {
				int rc = seccomp_rule_add(ctx, action, nr, 0);
				if (rc < 0)
					return rc;
			}
		}
		p += n;
		p += strspn(p, " ");
	}
	return 0;
}

/* The allow-list: each group's calls, then the calls allowed with certain arguments. In log
 * mode also the calls refused on purpose, refused as in the allow-list (its default would
 * log and allow them). */
static int add_allow_list(scmp_filter_ctx ctx, int log_mode)
{
	for (size_t g = 0; g < sbx_seccomp_allow_group_count; g++) {
		int rc = add_names(ctx, SCMP_ACT_ALLOW, sbx_seccomp_allow_groups[g].syscalls);
		if (rc < 0)
			return rc;
	}
	if (log_mode) {
		int rc = add_names(ctx, SCMP_ACT_ERRNO(SBX_SECCOMP_ALLOW_LIST_ERRNO),
				   sbx_seccomp_refused_on_purpose);
		if (rc < 0)
			return rc;
	}
	for (size_t i = 0; i < sbx_seccomp_allow_arg_count; i++) {
		const struct sbx_seccomp_rule *r = &sbx_seccomp_allow_args[i];
		int nr = seccomp_syscall_resolve_name(r->syscall);
		if (nr == __NR_SCMP_ERROR || nr < 0)
			continue;
		int rc = add_rule(ctx, SCMP_ACT_ALLOW, r, nr);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int sbx_seccomp_build(struct sbx_bpf *out, struct sbx_err *err)
{
	return sbx_seccomp_build_policy(SBX_SECCOMP_DENY_LIST, out, err);
}

int sbx_seccomp_build_policy(enum sbx_seccomp_policy policy, struct sbx_bpf *out,
			     struct sbx_err *err)
{
	out->insns = NULL;
	out->len = 0;
	out->log_refusals = 0;
	uint32_t dflt;
	switch (policy) {
	case SBX_SECCOMP_DENY_LIST:
		dflt = SCMP_ACT_ALLOW;
		break;
	case SBX_SECCOMP_ALLOW_LIST:
		dflt = SCMP_ACT_ERRNO(SBX_SECCOMP_ALLOW_LIST_ERRNO);
		break;
	case SBX_SECCOMP_ALLOW_LIST_LOG:
		dflt = SCMP_ACT_LOG;
		break;
	case SBX_SECCOMP__COUNT:
	default:
		return sbx_err_set(err, -EINVAL, "unknown seccomp policy %d", (int)policy);
	}
	/* Calls from a foreign ABI (x86 int 0x80 from an x86_64 process, which would otherwise dodge
	 * every rule) kill the process: SCMP_FLTATR_ACT_BADARCH's default. */
	__attribute__((cleanup(release_ctx))) scmp_filter_ctx ctx = seccomp_init(dflt);
	if (!ctx) {
		return sbx_err_sys(err, -ENOMEM, "seccomp_init");
	}
	int rc = policy == SBX_SECCOMP_DENY_LIST
			 ? add_deny_list(ctx)
			 : add_allow_list(ctx, policy == SBX_SECCOMP_ALLOW_LIST_LOG);
	if (rc < 0) {
		return sbx_err_sys(err, rc, "seccomp_rule_add");
	}
	/* libseccomp 2.5 exports to an fd only: a memfd keeps it off the file system. */
	_cleanup_close_ int fd = memfd_create("sbx-seccomp", MFD_CLOEXEC);
	if (fd < 0) {
		return sbx_err_sys(err, -errno, "memfd_create");
	}
	rc = seccomp_export_bpf(ctx, fd);
	if (rc < 0) {
		return sbx_err_sys(err, rc, "seccomp_export_bpf");
	}
	off_t size = lseek(fd, 0, SEEK_END);
	if (size <= 0 || size % (off_t)sizeof(struct sock_filter) != 0 ||
	    size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS) {
		return sbx_err_sys(err, -EIO, "seccomp_export_bpf (size)");
	}
	_cleanup_free_ struct sock_filter *insns = malloc((size_t)size);
	if (!insns) {
		return sbx_err_sys(err, -ENOMEM, "malloc");
	}
	size_t got = 0;
	while (got < (size_t)size) {
		ssize_t n = pread(fd, (char *)insns + got, (size_t)size - got, (off_t)got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			return sbx_err_sys(err, n < 0 ? -errno : -EIO, "pread(seccomp filter)");
		}
		got += (size_t)n;
	}
	out->log_refusals = policy != SBX_SECCOMP_ALLOW_LIST_LOG;
	out->insns = TAKE_PTR(insns);
	out->len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
	return 0;
}

static struct {
	pthread_once_t once;
	int rc;
	struct sbx_err err;
	struct sbx_bpf bpf;
} programs[SBX_SECCOMP__COUNT] = {
	[SBX_SECCOMP_ALLOW_LIST] = {.once = PTHREAD_ONCE_INIT},
	[SBX_SECCOMP_DENY_LIST] = {.once = PTHREAD_ONCE_INIT},
	[SBX_SECCOMP_ALLOW_LIST_LOG] = {.once = PTHREAD_ONCE_INIT},
};

#define BUILD_ONE(p)                                                                               \
	static void build_##p(void)                                                                \
	{                                                                                          \
		programs[p].rc = sbx_seccomp_build_policy(p, &programs[p].bpf, &programs[p].err);  \
	}
BUILD_ONE(SBX_SECCOMP_ALLOW_LIST)
BUILD_ONE(SBX_SECCOMP_DENY_LIST)
BUILD_ONE(SBX_SECCOMP_ALLOW_LIST_LOG)

int sbx_seccomp_program(const struct sbx_bpf **out, struct sbx_err *err)
{
	return sbx_seccomp_program_for(SBX_SECCOMP_DENY_LIST, out, err);
}

int sbx_seccomp_program_for(enum sbx_seccomp_policy policy, const struct sbx_bpf **out,
			    struct sbx_err *err)
{
	*out = NULL;
	switch (policy) {
	case SBX_SECCOMP_ALLOW_LIST:
		pthread_once(&programs[policy].once, build_SBX_SECCOMP_ALLOW_LIST);
		break;
	case SBX_SECCOMP_DENY_LIST:
		pthread_once(&programs[policy].once, build_SBX_SECCOMP_DENY_LIST);
		break;
	case SBX_SECCOMP_ALLOW_LIST_LOG:
		pthread_once(&programs[policy].once, build_SBX_SECCOMP_ALLOW_LIST_LOG);
		break;
	case SBX_SECCOMP__COUNT:
	default:
		return sbx_err_set(err, -EINVAL, "unknown seccomp policy %d", (int)policy);
	}
	if (programs[policy].rc < 0) {
		*err = programs[policy].err;
		return programs[policy].rc;
	}
	*out = &programs[policy].bpf;
	return 0;
}

void sbx_bpf_free(struct sbx_bpf *bpf)
{
	free(bpf->insns);
	bpf->insns = NULL;
	bpf->len = 0;
}

int sbx_seccomp_load(const struct sbx_bpf *bpf)
{
	struct sock_fprog prog = {.len = bpf->len, .filter = bpf->insns};
	if (!bpf->insns || !bpf->len)
		return -EINVAL;
	/* SECCOMP_FILTER_FLAG_LOG: a refused call shows in the host's kernel log (audit type 1326),
	 * so that an operator sees what a compromised or newer QEMU tried. Kernels before 4.14 lack
	 * the flag (EINVAL): load without it. */
	if (bpf->log_refusals) {
		if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_LOG, &prog) == 0)
			return 0;
		if (errno != EINVAL && errno != ENOSYS)
			return -errno;
	}
	return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0 ? 0 : -errno;
}
