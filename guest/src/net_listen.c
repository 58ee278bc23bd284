/* The listeners of the outbound side: see net_listen.h. */
#include "net_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"
#include "net_relay_guest.h"

#define ACCEPTS_PER_CALL 16

static uint16_t listen_port(const struct sbx_net *n, uint32_t k)
{
	return k == 0 ? 80 : k == 1 ? 443 : n->cfg.ports[k - 2];
}

void sbx_net_listen_open(struct sbx_net *n, uint32_t entry)
{
	uint32_t addr = sbx_name_table_addr(entry);
	uint32_t nports = 2 + n->cfg.port_count;
	for (uint32_t k = 0; k < nports; k++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			sbx_log("net listener: %s", strerror(errno));
			return;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (k < SBX_NET_CATCHALL_PORTS) /* beside the catch-all's wildcard on the port */
			setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons(listen_port(n, k)),
					 .sin_addr.s_addr = htonl(addr)};
		struct epoll_event ev = {.events = EPOLLIN,
					 .data.u64 = sbx_net_tag(SBX_NET_TAG_LISTENER,
								 entry * SBX_NET_LISTEN_PORTS + k)};
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0 ||
		    epoll_ctl(n->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			/* e.g. user code bound the wildcard on an extra port first */
			sbx_log("net listener port %u: %s", listen_port(n, k), strerror(errno));
			close(fd);
			continue;
		}
		n->listen_fd[entry][k] = fd;
	}
}

void sbx_net_listen_accept(struct sbx_net *n, uint32_t index)
{
	int lfd = n->listen_fd[index / SBX_NET_LISTEN_PORTS][index % SBX_NET_LISTEN_PORTS];
	for (int i = 0; i < ACCEPTS_PER_CALL; i++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct sockaddr_in sa;
		socklen_t len = sizeof(sa);
		const char *name;
		size_t name_len;
		if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 || sa.sin_family != AF_INET ||
		    sbx_name_table_find_addr(&n->table, ntohl(sa.sin_addr.s_addr), &name,
					     &name_len) < 0 ||
		    sbx_net_stream_open(n, fd, ntohs(sa.sin_port), name, name_len) < 0) {
			/* Over the stream limit, or the port is done: the client sees a reset. */
			struct linger lg = {.l_onoff = 1, .l_linger = 0};
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
			close(fd);
		}
	}
}

void sbx_net_catchall_open(struct sbx_net *n)
{
	for (uint32_t k = 0; k < SBX_NET_CATCHALL_PORTS; k++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			sbx_log("net catch-all: %s", strerror(errno));
			return;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons(listen_port(n, k)),
					 .sin_addr.s_addr = htonl(INADDR_ANY)};
		struct epoll_event ev = {.events = EPOLLIN,
					 .data.u64 = sbx_net_tag(SBX_NET_TAG_CATCHALL, k)};
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0 ||
		    epoll_ctl(n->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			sbx_log("net catch-all port %u: %s", listen_port(n, k), strerror(errno));
			close(fd);
			continue;
		}
		n->catchall_fd[k] = fd;
	}
}

static void reset(int fd)
{
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

void sbx_net_catchall_accept(struct sbx_net *n, uint32_t k)
{
	for (int i = 0; i < ACCEPTS_PER_CALL; i++) {
		int fd = accept4(n->catchall_fd[k], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct sockaddr_in sa;
		socklen_t len = sizeof(sa);
		if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 || sa.sin_family != AF_INET) {
			reset(fd);
			continue;
		}
		uint32_t addr = ntohl(sa.sin_addr.s_addr);
		uint32_t port = ntohs(sa.sin_port);
		const char *name;
		size_t name_len;
		if (sbx_name_table_find_addr(&n->table, addr, &name, &name_len) == 0) {
			if (sbx_net_stream_open(n, fd, port, name, name_len) < 0)
				reset(fd);
			continue;
		}
		reset(fd);
		if ((addr >> 24) == 127)
			continue; /* the guest itself: no attempt to reach anything */
		char text[INET_ADDRSTRLEN];
		if (inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text)))
			sbx_net_report_refusal(n, SBX_NET_REFUSAL_ADDRESS, port, text, strlen(text));
	}
}
