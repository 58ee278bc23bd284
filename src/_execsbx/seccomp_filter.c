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
#include <unistd.h>

#include "cleanup.h"
#include "seccomp_policy.h"

static void release_ctx(scmp_filter_ctx *ctx)
{
	if (*ctx)
		seccomp_release(*ctx);
}

static int add_rule(scmp_filter_ctx ctx, const struct sbx_seccomp_rule *r, int nr)
{
	uint32_t action = SCMP_ACT_ERRNO((uint32_t)r->error);
	switch (r->op) {
	case SBX_ARG_ANY:
		return seccomp_rule_add(ctx, action, nr, 0);
	case SBX_ARG_EQ:
		return seccomp_rule_add(ctx, action, nr, 1,
					SCMP_CMP(r->arg_index, SCMP_CMP_EQ, r->value));
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

int sbx_seccomp_build(struct sbx_bpf *out, struct sbx_err *err)
{
	out->insns = NULL;
	out->len = 0;
	/* Default: allow. Calls from a foreign ABI (x86 int 0x80 from an x86_64 process, which
	 * would otherwise dodge every rule) kill the process: SCMP_FLTATR_ACT_BADARCH's default. */
	__attribute__((cleanup(release_ctx))) scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	if (!ctx) {
		return sbx_err_sys(err, -ENOMEM, "seccomp_init");
	}
	for (size_t i = 0; i < sbx_seccomp_rule_count; i++) {
		const struct sbx_seccomp_rule *r = &sbx_seccomp_rules[i];
		int nr = seccomp_syscall_resolve_name(r->syscall);
		if (nr == __NR_SCMP_ERROR || nr < 0)
			continue; /* not a syscall of this architecture */
		int rc = add_rule(ctx, r, nr);
		if (rc < 0) {
			return sbx_err_sys(err, rc, "seccomp_rule_add");
		}
	}
	/* libseccomp 2.5 exports to an fd only: a memfd keeps it off the file system. */
	_cleanup_close_ int fd = memfd_create("sbx-seccomp", MFD_CLOEXEC);
	if (fd < 0) {
		return sbx_err_sys(err, -errno, "memfd_create");
	}
	int rc = seccomp_export_bpf(ctx, fd);
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
	out->insns = TAKE_PTR(insns);
	out->len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
	return 0;
}

static struct {
	pthread_once_t once;
	int rc;
	struct sbx_err err;
	struct sbx_bpf bpf;
} program = {.once = PTHREAD_ONCE_INIT};

static void build_program(void)
{
	program.rc = sbx_seccomp_build(&program.bpf, &program.err);
}

int sbx_seccomp_program(const struct sbx_bpf **out, struct sbx_err *err)
{
	pthread_once(&program.once, build_program);
	*out = program.rc < 0 ? NULL : &program.bpf;
	if (program.rc < 0)
		*err = program.err;
	return program.rc;
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
	return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0 ? 0 : -errno;
}
