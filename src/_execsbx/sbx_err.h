/* The one error convention of src/_execsbx (docs/c-conventions.md): a function that can fail
 * returns 0 (or a count) or a negative errno, and on failure fills the caller's struct sbx_err,
 * passed down explicitly (never NULL where a prototype takes one). The binding turns it into a
 * Python exception in one place (py_errors.c). Code between clone() and execve() does not use it
 * (formatting is not async-signal-safe): the child reports a step and an errno through its pipe
 * and the parent fills the struct. */
#ifndef SBX_ERR_H
#define SBX_ERR_H

#include <stddef.h>

struct sbx_err {
	int code;      /* positive errno; 0: no error recorded */
	int syscall;   /* 1: a system call failed and msg names the step (sbx_err_sys) */
	char msg[256]; /* what failed, complete in itself (sbx_err_set) or the step (sbx_err_sys) */
};

/* A failure explained by msg alone (an invalid request, a missing controller). Returns -code
 * (code is a negative errno, as the caller returns it). */
__attribute__((format(printf, 3, 4))) int sbx_err_set(struct sbx_err *e, int neg_errno,
						      const char *fmt, ...);
/* A system call failed: msg names the step ("execve", "pipe2", ...); strerror goes with it when
 * the error is shown. Returns neg_errno. */
__attribute__((format(printf, 3, 4))) int sbx_err_sys(struct sbx_err *e, int neg_errno,
						      const char *fmt, ...);
/* "msg" or "step: strerror" into buf (for logs and jail details). Returns buf. */
const char *sbx_err_text(const struct sbx_err *e, char *buf, size_t len);
void sbx_err_clear(struct sbx_err *e);

#endif /* SBX_ERR_H */
