/* The guest's half of the network (issue 13, net_protocol.h): a VM without a network device whose
 * TCP connections to the outside become named streams on the net port.
 *
 * Nothing runs until the host sends NET_CONFIG (only VMs started with the net port get one), so a
 * plain VM pays nothing. Then, with outbound allowed:
 *   - the synthetic range 198.18.0.0/15 is made local on lo (an address with a /15 netmask: the
 *     kernel adds a local route for the whole prefix), and nothing else is routable: an IP literal
 *     outside it fails at once with ENETUNREACH;
 *   - a DNS stub on SBX_NET_DNS_ADDR:53 (what /etc/resolv.conf names) answers allowed names with
 *     addresses of that range (dnsstub.h);
 *   - when a name first gets its address, the agent listens on that ADDRESS (not on a wildcard) on
 *     ports 80, 443 and the configured extra ports. Binding per address leaves every other
 *     address, 127.0.0.1 included, to user code: a user server on 127.0.0.1:8080 and the agent's
 *     198.18.0.1:8080 coexist. (A user server on the wildcard 0.0.0.0:8080 does collide with an
 *     extra port 8080 once a name is resolved: the later bind fails. IP_TRANSPARENT would need
 *     netfilter's TPROXY to steer connections to one socket, which the guest kernel lacks by
 *     design.) An accepted connection's getsockname() gives the address, hence the name: NET_OPEN.
 * Either way NET_CONNECT from the host (exposed ports) connects to 127.0.0.1:port.
 *
 * All sockets live in one epoll set whose fd joins the agent's poll loop (sbx_net_poll_fd). The
 * streams follow the header's credit flow control; a host that breaks it on a stream costs that
 * stream (CLOSE with reset), one that breaks the framing costs the whole net port (logged, every
 * stream closed): the agent itself goes on serving the agent channel.
 */
#ifndef SBX_NETRELAY_H
#define SBX_NETRELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dnsstub.h"
#include "frame.h"
#include "netwire.h"

/* The DNS stub's address: a loopback address of its own, so that 127.0.0.1 stays user code's. */
#define SBX_NET_DNS_ADDR "127.0.0.53"
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
/* Above this many bytes queued for the net port, stop reading the streams' sockets. Past it by at
 * most the frames of one loop turn: one per socket event already returned (netrelay.c). */
#define SBX_NET_OUT_HIGH_WATER (512u * 1024u)
#define SBX_NET_LISTEN_PORTS (2u + SBX_NET_EXTRA_PORTS_MAX)

enum sbx_net_stream_state {
	SBX_NS_FREE = 0,
	SBX_NS_OPENING,    /* guest stream: NET_OPEN sent, waiting for NET_OPENED */
	SBX_NS_CONNECTING, /* host stream: connect() to 127.0.0.1 in progress */
	SBX_NS_OPEN,
	SBX_NS_CLOSING,    /* NET_CLOSE sent, socket gone, waiting for the host's NET_CLOSE */
};

struct sbx_net_stream {
	uint32_t id;
	enum sbx_net_stream_state state;
	int fd;             /* -1 once closed */
	bool sock_failed;   /* OPENING: the client went away before NET_OPENED */
	bool eof_sent;      /* the socket said EOF: NET_SHUTDOWN sent */
	bool host_shut;     /* NET_SHUTDOWN received: shut the socket's write side once drained */
	bool wr_shut;
	bool drain_due;     /* DATA appended to pending during this port read, not yet written */
	bool parked;        /* out of the epoll set: hung up while nothing could be done (a level-
			     * triggered EPOLLHUP would wake the loop without end) */
	bool read_full;     /* this turn's read filled its frame: more may be waiting */
	uint16_t generation; /* of the slot, counted on each reuse: in its epoll tag (netrelay.c) */
	uint32_t send_credit;   /* bytes of DATA the host still takes */
	uint32_t recv_inflight; /* bytes the host sent that are not credited back yet */
	uint32_t to_credit;     /* written to the socket, not credited yet */
	struct sbx_buf pending; /* host bytes not yet written to the socket */
	size_t pending_off;
	uint32_t events;        /* the epoll mask in force */
};

struct sbx_net {
	bool configured;
	bool broken; /* the host broke the net port's framing: no more reading */
	int epfd;
	int port_fd;
	uint32_t port_events;
	int dns_fd;
	uint8_t *cfg_buf; /* the NET_CONFIG payload, owned: cfg points into it */
	struct sbx_net_config cfg;
	struct sbx_name_table table;
	int listen_fd[SBX_NET_TABLE_MAX][SBX_NET_LISTEN_PORTS];
	struct sbx_reader reader;
	struct sbx_buf out;
	size_t out_off;
	uint32_t next_id;
	uint32_t read_from; /* the slot after the last extra read: where the next turn starts */
	struct sbx_net_stream streams[SBX_NET_STREAMS_MAX];
};

/* Boot (every VM, two syscalls): SBX_NET_CA_FILE -> the image's bundle, SBX_NET_NODE_CA_FILE ->
 * /dev/null. The clean environment names them only once they exist (sbx_net_trust_ready): a test
 * agent on the host, without boot, has neither. */
bool sbx_net_trust_ready(void);
void sbx_net_boot_trust(void);

void sbx_net_init(struct sbx_net *n);
/* NET_CONFIG: 0, or -errno with msg (size cap) saying why; the host then gets ERROR. In test mode
 * port_fd >= 0 is the net port (a socket; the caller keeps it, this works on a copy); otherwise
 * the port is found by name. A second NET_CONFIG is refused (-EALREADY). own_net_ns: the agent may
 * change lo (the VM, or a test agent booted in its own namespaces); outbound needs it. */
int sbx_net_configure(struct sbx_net *n, const uint8_t *payload, size_t len, int port_fd,
		      bool test_mode, bool own_net_ns, char *msg, size_t cap);
/* The fd to poll for POLLIN (the epoll set), or -1 while not configured. */
int sbx_net_poll_fd(const struct sbx_net *n);
/* Serve whatever is ready (non-blocking, bounded work per call). */
void sbx_net_handle(struct sbx_net *n);

#endif /* SBX_NETRELAY_H */
