/* Inline bootstraps of the pre-started interpreters: see bootstrap.c. */
#ifndef SBX_BOOTSTRAP_H
#define SBX_BOOTSTRAP_H

extern const char sbx_bootstrap_python[];
extern const char sbx_bootstrap_raw[];

#endif /* SBX_BOOTSTRAP_H */
