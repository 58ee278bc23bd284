/* The synthetic range on lo: see net_routes.h. */
#include "net_routes.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "cleanup.h"
#include "net_protocol.h"

/* Send one rtnetlink request (its header first, nlmsg_len its whole size) and read the kernel's
 * answer: 0 when done or already there (EEXIST), else the negative errno. */
static int netlink_request(const struct nlmsghdr *req)
{
	_cleanup_close_ int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (fd < 0)
		return -errno;
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	if (sendto(fd, req, req->nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
		return -errno;
	struct {
		struct nlmsghdr nh;
		struct nlmsgerr err;
	} ack;
	ssize_t r = recv(fd, &ack, sizeof(ack), 0);
	if (r < 0)
		return -errno;
	if ((size_t)r < sizeof(ack) || ack.nh.nlmsg_type != NLMSG_ERROR)
		return -EPROTO;
	return ack.err.error == -EEXIST ? 0 : ack.err.error;
}

int sbx_net_add_synthetic_range(void)
{
	struct {
		struct nlmsghdr nh;
		struct ifaddrmsg ifa;
		struct rtattr a1;
		uint32_t local;
		struct rtattr a2;
		uint32_t address;
	} req;
	memset(&req, 0, sizeof(req));
	unsigned lo = if_nametoindex("lo");
	if (!lo)
		return -errno;
	uint32_t addr = htonl(SBX_NET_SYNTHETIC_BASE + 1u);
	req.nh.nlmsg_len = sizeof(req);
	req.nh.nlmsg_type = RTM_NEWADDR;
	req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
	req.nh.nlmsg_seq = 1;
	req.ifa.ifa_family = AF_INET;
	req.ifa.ifa_prefixlen = SBX_NET_SYNTHETIC_PREFIX;
	req.ifa.ifa_scope = RT_SCOPE_HOST;
	req.ifa.ifa_index = lo;
	req.a1.rta_len = RTA_LENGTH(4);
	req.a1.rta_type = IFA_LOCAL;
	req.local = addr;
	req.a2.rta_len = RTA_LENGTH(4);
	req.a2.rta_type = IFA_ADDRESS;
	req.address = addr;
	return netlink_request(&req.nh);
}

int sbx_net_route_everything_local(void)
{
	unsigned lo = if_nametoindex("lo");
	if (!lo)
		return -errno;
	struct {
		struct nlmsghdr nh;
		struct rtmsg rt;
		struct rtattr a1;
		uint32_t oif;
	} req;
	memset(&req, 0, sizeof(req));
	req.nh.nlmsg_len = sizeof(req);
	req.nh.nlmsg_type = RTM_NEWROUTE;
	req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
	req.nh.nlmsg_seq = 1;
	req.rt.rtm_family = AF_INET;
	req.rt.rtm_dst_len = 0;
	req.rt.rtm_table = RT_TABLE_LOCAL;
	req.rt.rtm_protocol = RTPROT_BOOT;
	req.rt.rtm_scope = RT_SCOPE_HOST;
	req.rt.rtm_type = RTN_LOCAL;
	req.a1.rta_len = RTA_LENGTH(4);
	req.a1.rta_type = RTA_OIF;
	req.oif = lo;
	return netlink_request(&req.nh);
}
