/* The CA trust store user code's TLS clients read: two fixed files under /run/sbx, the image's
 * bundle until NET_CONFIG brings the host's (docs/protocol.md, "CA bundle"). Owns nothing but
 * those files; the paths are what the clean environment of user code names (spawn.c). */
#ifndef SBX_NET_TRUST_H
#define SBX_NET_TRUST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The CA bundle every client uses (the clean environment's SSL_CERT_FILE & co., and the image's
 * system bundle, a symlink to it): at boot a symlink to the image's own bundle, replaced by the
 * host's bundle from NET_CONFIG. A fixed path, so that interpreters started before NET_CONFIG
 * (pooled, snapshot templates) read the right file when they first open it. */
#define SBX_NET_CA_FILE "/run/sbx/ca-certificates.crt"
#define SBX_NET_IMAGE_CA_FILE "/usr/lib/sbx/ca-certificates.crt"
/* Node's NODE_EXTRA_CA_CERTS: read at every node start (a whole bundle there would cost each
 * start the parsing of ~150 certificates its built-in store already has), so at boot it is
 * empty (a symlink to /dev/null) and NET_CONFIG's bundle, when there is one, is written there
 * too. */
#define SBX_NET_NODE_CA_FILE "/run/sbx/extra-ca-certificates.crt"

/* Boot (every VM, two syscalls): SBX_NET_CA_FILE -> the image's bundle, SBX_NET_NODE_CA_FILE ->
 * /dev/null. Failures are logged, never fatal. The clean environment names them only once they
 * exist (sbx_net_trust_ready): a test agent on the host, without boot, has neither. */
bool sbx_net_trust_ready(void);
void sbx_net_boot_trust(void);

/* NET_CONFIG's bundle (pem, len bytes) replaces SBX_NET_CA_FILE, then SBX_NET_NODE_CA_FILE, each
 * written aside and renamed over the old one, so that a client never reads half a bundle. 0, or
 * -errno of the first file that failed (nothing of it left behind; a failure on the second
 * leaves the first already replaced). */
int sbx_net_install_ca(const uint8_t *pem, size_t len);

#endif /* SBX_NET_TRUST_H */
