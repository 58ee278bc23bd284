/* The disk workspace (docs/design.md, "Workspace"): /home/user and /tmp on the VM's own disk of
 * kind "work" when the host attached one, instead of RAM. */
#ifndef SBX_WORKSPACE_H
#define SBX_WORKSPACE_H

#include <stdbool.h>

/* Where the work disk's file system is mounted; home/ and tmp/ on it are bound on /home/user and
 * /tmp. Under /run: a tmpfs, so the mount point exists on a read-only root. */
#define SBX_WORK_DIR "/run/sbx-work"
#define SBX_WORK_HOME SBX_WORK_DIR "/home"
#define SBX_WORK_TMP SBX_WORK_DIR "/tmp"

/* Find the work disk, format it if it holds no ext4 yet, mount it on SBX_WORK_DIR and create
 * home/ and tmp/ on it. 1: mounted (bind its directories with sbx_workspace_bind), 0: no work
 * disk, -errno: there is one but it could not be set up (the caller falls back to tmpfs). */
int sbx_workspace_setup(void);

/* Bind SBX_WORK_HOME on home and SBX_WORK_TMP on tmp (nosuid, nodev); 0 or -errno. */
int sbx_workspace_bind(const char *home, const char *tmp);

/* Whether /home/user and /tmp are on the work disk (set by sbx_workspace_bind). */
bool sbx_workspace_active(void);

#endif /* SBX_WORKSPACE_H */
