/* Kernel settings the agent writes at boot through /proc/sys (see sysctl.c). */
#ifndef SBX_SYSCTL_H
#define SBX_SYSCTL_H

/* Write value to a /proc/sys file: 0 or -errno. */
int sbx_write_sysctl(const char *path, const char *value);
/* Every setting below, each failure logged (not fatal: the agent still serves). Needs /proc. */
void sbx_apply_sysctls(void);

#endif /* SBX_SYSCTL_H */
