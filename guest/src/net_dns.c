/* The DNS stub's socket: see net_dns.h. */
#include "net_dns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dnsstub.h"
#include "net_listen.h"
#include "net_relay_guest.h"

#define DNS_QUERIES_PER_CALL 16

int sbx_net_dns_open(struct sbx_net *n)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(53)};
	inet_pton(AF_INET, SBX_NET_DNS_ADDR, &sa.sin_addr);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = sbx_net_tag(SBX_NET_TAG_DNS, 0)};
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    epoll_ctl(n->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int err = errno;
		close(fd);
		return -err;
	}
	n->dns_fd = fd;
	return 0;
}

void sbx_net_dns_serve(struct sbx_net *n)
{
	uint8_t q[SBX_DNS_MSG_MAX + 1], reply[SBX_DNS_MSG_MAX];
	for (int i = 0; i < DNS_QUERIES_PER_CALL; i++) {
		struct sockaddr_storage from;
		socklen_t flen = sizeof(from);
		ssize_t r = recvfrom(n->dns_fd, q, sizeof(q), MSG_DONTWAIT | MSG_TRUNC,
				     (struct sockaddr *)&from, &flen);
		if (r < 0)
			return;
		int entry;
		/* MSG_TRUNC: r is the datagram's real size, so an oversized one is seen as such. */
		size_t qn = (size_t)r > sizeof(q) ? sizeof(q) : (size_t)r;
		size_t len =
			sbx_dns_answer(&n->cfg, &n->table, q, qn, reply, sizeof(reply), &entry);
		/* Listeners before the answer: a connect may follow at once. */
		if (entry >= 0)
			sbx_net_listen_open(n, (uint32_t)entry);
		if (len)
			sendto(n->dns_fd, reply, len, MSG_DONTWAIT, (struct sockaddr *)&from, flen);
		char name[SBX_NET_NAME_MAX + 1];
		size_t name_len;
		if (len && sbx_dns_refused_name(&n->cfg, q, qn, name, &name_len))
			sbx_net_report_refusal(n, SBX_NET_REFUSAL_NAME, 0, name, name_len);
	}
}
