/* The guest's half of the network (net_protocol.h): a VM without a network device whose TCP
 * connections to the outside become named streams on the net port.
 *
 * Nothing runs until the host sends NET_CONFIG (only VMs started with the net port get one), so a
 * plain VM pays nothing. Then, with outbound allowed:
 *   - the synthetic range 198.18.0.0/15 is made local on lo (net_routes.h), and all of IPv4
 *     with it: a connection to an address no name was given (an IP literal, an unassigned
 *     synthetic address) on 80 or 443 reaches the catch-all (net_listen.h), which resets it and
 *     reports it (NET_REFUSED); on other ports it is refused at once;
 *   - a DNS stub on SBX_NET_DNS_ADDR:53 (net_dns.h, what /etc/resolv.conf names) answers allowed
 *     names with addresses of that range (dnsstub.h);
 *   - when a name first gets its address, the agent listens on that ADDRESS (not on a wildcard) on
 *     ports 80, 443 and the configured extra ports (net_listen.h). Binding per address leaves
 *     every other address, 127.0.0.1 included, to user code: a user server on 127.0.0.1:8080 and
 *     the agent's 198.18.0.1:8080 coexist. (A user server on the wildcard 0.0.0.0:8080 does
 *     collide with an extra port 8080 once a name is resolved: the later bind fails.
 *     IP_TRANSPARENT would need netfilter's TPROXY to steer connections to one socket, which the
 *     guest kernel lacks by design.) An accepted connection's getsockname() gives the address,
 *     hence the name: NET_OPEN.
 * Either way NET_CONNECT from the host (exposed ports) connects to 127.0.0.1:port. NET_CONFIG's CA
 * bundle goes to the trust store (net_trust.h).
 *
 * This is the relay (net_relay_guest.c): NET_CONFIG, the net port's I/O and the streams. It owns
 * struct sbx_net and its one epoll set, whose fd joins the agent's poll loop (sbx_net_poll_fd);
 * the listeners and the DNS socket add their sockets to that set with their tags (below) and are
 * called from sbx_net_handle. The streams follow net_protocol.h's credit flow control; a host
 * that breaks it on a stream costs that stream (CLOSE with reset), one that breaks the framing
 * costs the whole net port (logged, every stream closed): the agent itself goes on serving the
 * agent channel.
 */
#ifndef SBX_NET_RELAY_GUEST_H
#define SBX_NET_RELAY_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dnsstub.h"
#include "frame.h"
#include "net_listen.h"
#include "net_wire_guest.h"

/* Above this many bytes queued for the net port, stop reading the streams' sockets. Past it by at
 * most the frames of one loop turn: one per socket event already returned (net_relay_guest.c). */
#define SBX_NET_OUT_HIGH_WATER (512u * 1024u)

/* Every socket of the net is in n->epfd with data.u64 = sbx_net_tag(kind, index); sbx_net_handle
 * hands each event to the kind's owner: the port and the streams here, SBX_NET_TAG_DNS to
 * sbx_net_dns_serve, SBX_NET_TAG_LISTENER (index: the listener's) to sbx_net_listen_accept,
 * SBX_NET_TAG_CATCHALL (index: the port's) to sbx_net_catchall_accept. */
enum sbx_net_tag {
	SBX_NET_TAG_PORT = 1,
	SBX_NET_TAG_DNS,
	SBX_NET_TAG_LISTENER,
	SBX_NET_TAG_STREAM,
	SBX_NET_TAG_CATCHALL,
};

static inline uint64_t sbx_net_tag(enum sbx_net_tag t, uint32_t index)
{
	return (uint64_t)t << 32 | index;
}

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
	uint16_t generation; /* of the slot, counted on each reuse: in its epoll tag (stream_tag) */
	uint32_t send_credit;   /* bytes of DATA the host still takes */
	uint32_t recv_inflight; /* bytes the host sent that are not credited back yet */
	uint32_t to_credit;     /* written to the socket, not credited yet */
	struct sbx_buf pending; /* host bytes not yet written to the socket */
	size_t pending_off;
	uint32_t events;        /* the epoll mask in force */
};

/* What the guest refused itself, told the host (NET_REFUSED) within a rate limit: a burst of
 * SBX_NET_REPORTS_BURST, then SBX_NET_REPORTS_PER_SECOND; a report identical to one of the last
 * SBX_NET_REPORTS_RECENT is not sent again within a second (a resolver asks A and AAAA, retries);
 * those left out are counted and sent as one REFUSAL_DROPPED with the next one let through. */
#define SBX_NET_REPORTS_BURST 16u
#define SBX_NET_REPORTS_PER_SECOND 4u
#define SBX_NET_REPORTS_RECENT 8u
struct sbx_refusal_reports {
	uint32_t tokens;
	uint64_t refill_ns;
	uint64_t dropped;
	struct {
		uint64_t hash, at_ns;
	} recent[SBX_NET_REPORTS_RECENT];
	uint32_t recent_pos;
};

struct sbx_net {
	bool configured;
	bool broken; /* the host broke the net port's framing: no more reading */
	int epfd;
	int port_fd;
	uint32_t port_events;
	int dns_fd; /* net_dns.c's */
	uint8_t *cfg_buf; /* the NET_CONFIG payload, owned: cfg points into it */
	struct sbx_net_config cfg;
	struct sbx_name_table table; /* filled by the DNS stub, read by the listeners */
	int listen_fd[SBX_NET_TABLE_MAX][SBX_NET_LISTEN_PORTS]; /* net_listen.c's */
	int catchall_fd[SBX_NET_CATCHALL_PORTS];               /* net_listen.c's */
	struct sbx_reader reader;
	struct sbx_buf out;
	size_t out_off;
	uint32_t next_id;
	uint32_t read_from; /* the slot after the last extra read: where the next turn starts */
	struct sbx_net_stream streams[SBX_NET_STREAMS_MAX];
	struct sbx_refusal_reports reports;
};

void sbx_net_init(struct sbx_net *n);
/* NET_CONFIG: 0, or -errno with msg (size cap) saying why; the host then gets ERROR. In test mode
 * port_fd >= 0 is the net port (a socket; the caller keeps it, this works on a copy); otherwise
 * the port is found by name. A second NET_CONFIG is refused (-EALREADY) unless it has
 * SBX_NET_CONFIG_REATTACH (a restored VM: every stream is reset, see net_protocol.h). own_net_ns: the agent may
 * change lo (the VM, or a test agent booted in its own namespaces); outbound needs it. */
int sbx_net_configure(struct sbx_net *n, const uint8_t *payload, size_t len, int port_fd,
		      bool test_mode, bool own_net_ns, char *msg, size_t cap);
/* The fd to poll for POLLIN (the epoll set), or -1 while not configured. */
int sbx_net_poll_fd(const struct sbx_net *n);
/* Serve whatever is ready (non-blocking, bounded work per call). */
void sbx_net_handle(struct sbx_net *n);

/* For the listeners: fd, a connection accepted on the synthetic address of `name` (name_len
 * bytes, from n->table) at `port`, becomes a guest stream that sends NET_OPEN(port, name) and
 * reads nothing before NET_OPENED. 0: the relay owns fd. -EPIPE (the net port is done) or -EAGAIN
 * (every stream slot taken): nothing was sent, the caller keeps fd. */
int sbx_net_stream_open(struct sbx_net *n, int fd, uint32_t port, const char *name,
			size_t name_len);
/* An attempt the guest refused itself (what: enum sbx_net_refusal but DROPPED; subject len bytes:
 * a name, or an address in dotted-quad form), for the host's log, within the rate limit above and
 * only while the port is not backed up. */
void sbx_net_report_refusal(struct sbx_net *n, uint32_t what, uint32_t port, const char *subject,
			    size_t len);

#endif /* SBX_NET_RELAY_GUEST_H */
