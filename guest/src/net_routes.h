/* The synthetic range on lo, through rtnetlink: what makes the names' addresses (dnsstub.h)
 * bindable by the listeners (net_listen.h). Done once, at NET_CONFIG with outbound allowed, in
 * the VM's own network namespace (never on a test agent's host: net_relay_guest.c checks). */
#ifndef SBX_NET_ROUTES_H
#define SBX_NET_ROUTES_H

/* 198.18.0.1/15 (SBX_NET_SYNTHETIC_BASE + 1, SBX_NET_SYNTHETIC_PREFIX) on lo: with the /15 prefix
 * the kernel adds a local route for the whole range (as 127.0.0.1/8 does for 127/8), so every
 * synthetic address is bindable and a connect to one without a listener is refused at once. 0,
 * also when
 * the address is already there; or -errno (-EPROTO: the kernel's answer was not an ack). */
int sbx_net_add_synthetic_range(void);

/* A local route for all of IPv4 (0.0.0.0/0, table local, dev lo): a connect to any address
 * reaches this VM's own sockets, where the catch-all listeners (net_listen.h) take those on 80
 * and 443 that no name's listener has, to reset and report them; on other ports it is refused at
 * once (ECONNREFUSED instead of ENETUNREACH). 0, also when the route is there; or -errno. */
int sbx_net_route_everything_local(void);

#endif /* SBX_NET_ROUTES_H */
