/* Decoding of what the host sends for the network (net_protocol.h): the NET_CONFIG payload on the
 * agent channel and the frames on the net port. Pure: no I/O, no allocation; every pointer it
 * hands out points into the frame it was given. The net port is fuzzed (tests/c/fuzz_guest_net.c):
 * the host is trusted, but the agent is PID 1 and a length field that walks out of a payload
 * would be a dead VM, or worse, a way in. */
#ifndef SBX_NET_WIRE_GUEST_H
#define SBX_NET_WIRE_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "net_protocol.h"

struct sbx_net_config {
	uint32_t flags;
	uint32_t name_count;
	/* validated patterns (sbx_net_name_valid) or "*" */
	const uint8_t *names[SBX_NET_NAMES_MAX];
	uint32_t name_len[SBX_NET_NAMES_MAX];
	uint32_t port_count;
	uint16_t ports[SBX_NET_EXTRA_PORTS_MAX]; /* 1..65535, none 80 or 443, no duplicates kept */
	const uint8_t *ca_bundle;                /* PEM; NULL when empty */
	uint32_t ca_len;
};

/* A DNS name as the protocol allows it: 1..SBX_NET_NAME_MAX bytes of lowercase letters, digits,
 * '-' and '.', labels of 1..63 bytes, none starting or ending with '-', no trailing dot. */
bool sbx_net_name_valid(const uint8_t *s, size_t n);

/* 0 and *out filled, or -EPROTO/-EMSGSIZE with *why a static explanation. */
int sbx_net_parse_config(const uint8_t *p, size_t n, struct sbx_net_config *out, const char **why);

/* A frame the host sent on the net port, checked for shape (not yet against the stream table). */
struct sbx_net_host_msg {
	uint8_t type;     /* SBX_NET_MSG_OPENED, CONNECT, DATA, CREDIT, SHUTDOWN or CLOSE */
	uint32_t id;      /* stream id, never 0 */
	uint32_t value;   /* OPENED: status; CONNECT: port; CREDIT: bytes; CLOSE: 0/1 */
	const uint8_t *data; /* DATA: the bytes; OPENED: the reason */
	uint32_t len;
};

/* 0, or -EPROTO with *why: a frame no host may send (unknown type, wrong size, id 0, an id on the
 * wrong side for the type, a status/port/credit out of range). */
int sbx_net_parse_host_frame(const struct sbx_frame *f, struct sbx_net_host_msg *out,
			     const char **why);

/* Whether a name is allowed by the patterns: equal to one, or a subdomain of one at a label
 * boundary ("xexample.org" is not under "example.org"), or any name with "*". */
bool sbx_net_name_allowed(const struct sbx_net_config *c, const uint8_t *name, size_t n);

#endif /* SBX_NET_WIRE_GUEST_H */
