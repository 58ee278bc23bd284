/* The two modes the host picks with what it attaches and the kernel command line:
 *
 * Template mode: a disk with the serial "sbx-disk-template" holds an EROFS template image
 * (template_image.h). At boot it is mounted read-only at SBX_TEMPLATE_DIR/image, a tmpfs at
 * SBX_TEMPLATE_DIR/rw takes the writes, and an overlay of the two is the template's root,
 * SBX_TEMPLATE_DIR/root, with the agent's own pieces bound in: proc (hidepid=2), /dev (pts, shm),
 * a fresh /tmp, the agent's /home/user, /etc/resolv.conf and /etc/hosts, /usr/lib/sbx (read-only:
 * drivers, preloads, runtime) and /run/sbx (code files, REPL FIFOs, the host socket, the CA
 * bundle). Every mount point is resolved inside that root (openat2 RESOLVE_IN_ROOT), so that a
 * symlink in the image cannot move a mount onto the agent's own tree. User code is chrooted
 * there before its uid switch (spawn.c). No /sys.
 *
 * Builder mode (`sbx.builder=1` on the kernel command line, which only the host's template
 * builder sets): EXECs run as root, without a chroot, in /, raw only; the disks "sbx-disk-source"
 * and "sbx-disk-base" are mounted read-only at SBX_BUILD_DIR/source and /base; "sbx-disk-output"
 * is left to the build script (/usr/lib/sbx/template-build). */
#ifndef SBX_TEMPLATE_H
#define SBX_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent.h"

#define SBX_TEMPLATE_DIR "/run/sbx/template"
#define SBX_BUILD_DIR "/run/sbx/build"

/* Whether the kernel command line asks for builder mode. */
bool sbx_builder_requested(void);
/* Builder mode's mounts (logged failures: the build script then fails, visibly). */
void sbx_builder_setup(void);

/* Boot: when the template disk is there, mount it and fill cfg->tpl (a failure leaves
 * cfg->tpl.error set: runs are refused, not run in the default image). Nothing otherwise. */
void sbx_template_setup(struct sbx_config *cfg);

/* Whether a run of `language` can start in this VM's mode: false with msg (and the ERROR code
 * in *code) when the template failed, lacks the interpreter, or the builder is asked for other
 * than a one-shot raw run. `needs_bash`: a session or a pre-started shell (their bootstraps are
 * bash). */
bool sbx_mode_allows(const struct sbx_config *cfg, uint8_t language, bool session_or_prestart,
		     uint32_t *code, char *msg, size_t msg_size);

#endif /* SBX_TEMPLATE_H */
