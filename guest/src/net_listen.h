/* The listeners of the outbound side: for each name that got a synthetic address (dnsstub.h),
 * one TCP socket on that address (not a wildcard) per outbound port, 80, 443 and NET_CONFIG's
 * extra ports, in the net's epoll set (SBX_NET_TAG_LISTENER). Binding per address leaves every
 * other address, 127.0.0.1 included, to user code. An accepted connection's getsockname() gives
 * the address, hence the name, and goes to the relay as a new guest stream (sbx_net_stream_open).
 * Owns n->listen_fd; reads n->cfg and n->table. The sockets live as long as the VM. */
#ifndef SBX_NET_LISTEN_H
#define SBX_NET_LISTEN_H

#include <stdint.h>

#include "net_protocol.h"

/* Listeners per name: 80, 443, then the extra ports in NET_CONFIG's order (index k). */
#define SBX_NET_LISTEN_PORTS (2u + SBX_NET_EXTRA_PORTS_MAX)
/* The catch-all listeners: 80 and 443 (index k). */
#define SBX_NET_CATCHALL_PORTS 2u

struct sbx_net;

/* Listen on the address of table entry `entry` on every outbound port. A port that cannot be had
 * (e.g. user code bound the wildcard on an extra port first) is logged and left out; the others
 * are opened anyway. */
void sbx_net_listen_open(struct sbx_net *n, uint32_t entry);

/* The listener with epoll index `index` (entry * SBX_NET_LISTEN_PORTS + k) is readable: accept
 * up to 16 connections. One the relay does not take (the port is done, or at the stream limit)
 * is reset at once. */
void sbx_net_listen_accept(struct sbx_net *n, uint32_t index);

/* The catch-all: a wildcard listener on 80 and 443 (SO_REUSEPORT, as the names' own on those
 * ports: a connection to a name's address still goes to the name's listener, the more specific
 * bind). With every IPv4 address local (net_routes.h) it gets each connection on those ports to an
 * address no name was given: an IP literal, an unassigned synthetic address. uid 1000 cannot bind
 * either port, so it takes nothing from user code. Logged and left out when it cannot be had. */
void sbx_net_catchall_open(struct sbx_net *n);
/* Accept up to 16 connections on catch-all port k: each is reset at once and, unless it is to
 * loopback (the guest talking to itself), reported to the host (NET_REFUSED, an address). One to
 * a name's address (its own listener could not be had) becomes that name's stream instead. */
void sbx_net_catchall_accept(struct sbx_net *n, uint32_t k);

#endif /* SBX_NET_LISTEN_H */
