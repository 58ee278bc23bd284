/* Namespaces for the QEMU child: which ones to make, and what to do inside them before exec. The
 * PID namespace is made by clone() itself (qemu_spawn.c), so that QEMU is PID 1 of it; the others by
 * the child (sbx_ns_setup_child), so that their cost is not the parent's. */
#ifndef SBX_NAMESPACES_H
#define SBX_NAMESPACES_H

/* CLONE_NEW* flags for a VM: mount, IPC, UTS and PID always; network when the VM has none. */
int sbx_ns_clone_flags(int vm_has_network);
/* Parent-side: does this kernel have mount_setattr(2) (recursive read-only bind)? 1 or 0. */
int sbx_ns_have_mount_setattr(void);

/* Child-side, in its new PID namespace, before exec; async-signal-safe (raw syscalls only).
 * First unshare() every namespace of clone_flags but CLONE_NEWPID. With CLONE_NEWNS: stop mount propagation both ways (MS_PRIVATE, recursively), then, if
 * read_only, make the whole tree read-only for this namespace (QEMU writes no file).
 * With CLONE_NEWPID too: a /proc of the new PID namespace, so QEMU sees only itself.
 * With CLONE_NEWUTS: a hostname of its own. Returns 0 or -errno and *what names the step. */
struct sbx_root_plan;
/* With a root plan (and CLONE_NEWNS|CLONE_NEWPID): instead of the host's tree, a fresh tmpfs on
 * plan->mnt holding read-only binds of plan's files and a /proc, made the root with
 * pivot_root(2); the host's tree is detached. */
int sbx_ns_setup_child(int clone_flags, int read_only, const struct sbx_root_plan *plan,
		       const char **what);

#endif /* SBX_NAMESPACES_H */
