/* The DNS stub's socket: UDP SBX_NET_DNS_ADDR:53, the address the image's /etc/resolv.conf names,
 * opened at NET_CONFIG with outbound allowed and kept for the VM's life. The answers are
 * dnsstub.h's (pure); this file only moves datagrams, and opens a name's listeners
 * (net_listen.h) when the name gets its address. Owns n->dns_fd; reads n->cfg, fills n->table.
 * TCP is not served: the answers are far below 512 bytes. In a VM without network nothing listens
 * there, so lookups fail at once. */
#ifndef SBX_NET_DNS_H
#define SBX_NET_DNS_H

/* The DNS stub's address: a loopback address of its own, so that 127.0.0.1 stays user code's. */
#define SBX_NET_DNS_ADDR "127.0.0.53"

struct sbx_net;

/* Bind the socket and add it to n->epfd (SBX_NET_TAG_DNS). 0, or -errno with nothing left open. */
int sbx_net_dns_open(struct sbx_net *n);

/* The socket is readable: answer up to 16 queries waiting. A name given its address gets its
 * listeners before its answer goes out, so that a connect may follow the answer at once. */
void sbx_net_dns_serve(struct sbx_net *n);

#endif /* SBX_NET_DNS_H */
