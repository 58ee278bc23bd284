/* libFuzzer target for the guest's network decoders, what guest/src/net_relay_guest.c and
 * net_dns.c run on bytes they did not make:
 *   mode 0: the net port's byte stream (sbx_reader with SBX_NET_FRAME_MAX, split at pseudo-random
 *           points) and sbx_net_parse_host_frame for every frame;
 *   mode 1: a NET_CONFIG payload (sbx_net_parse_config), and the name check of the patterns;
 *   mode 2: DNS queries to the stub (sbx_dns_answer), one after another on one name table, as a
 *           process in the guest (user code: hostile to the agent too) can send them.
 * Every accepted result is checked against the limits of net_protocol.h / dnsstub.h, and every
 * pointer it holds is read (ASan: inside the input).
 *
 * Input layout: 1 byte mode, 2 bytes seed, then the bytes. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "../../guest/src/dnsstub.h"
#include "../../guest/src/net_wire_guest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

static volatile uint32_t sink;

static bool inside(const uint8_t *p, size_t n, const uint8_t *base, size_t len)
{
	return n == 0 || (p >= base && p + n <= base + len);
}

static void net_port_stream(const uint8_t *data, size_t size, uint32_t seed)
{
	struct sbx_reader rd;
	sbx_reader_init(&rd, SBX_NET_FRAME_MAX);
	size_t off = 0;
	while (off < size) {
		seed = seed * 1103515245u + 12345u;
		size_t chunk = 1 + (seed >> 8) % 8192;
		if (chunk > size - off)
			chunk = size - off;
		if (sbx_reader_feed(&rd, data + off, chunk) < 0)
			break;
		off += chunk;
		struct sbx_frame f;
		int rc;
		while ((rc = sbx_reader_next(&rd, &f)) == 1) {
			struct sbx_net_host_msg m;
			const char *why = NULL;
			int prc = sbx_net_parse_host_frame(&f, &m, &why);
			if (prc < 0) {
				REQUIRE(prc == -EPROTO && why && why[0]);
				continue;
			}
			REQUIRE(m.id != 0 && m.type == f.type);
			REQUIRE(inside(m.data, m.len, f.payload, f.payload_len));
			uint32_t sum = 0;
			for (uint32_t i = 0; i < m.len; i++)
				sum += m.data[i];
			sink = sum;
			switch (m.type) {
			case SBX_NET_MSG_DATA:
				REQUIRE(m.len >= 1 && m.len <= SBX_NET_DATA_MAX);
				break;
			case SBX_NET_MSG_CREDIT:
				REQUIRE(m.value >= 1 && m.value <= SBX_NET_WINDOW);
				break;
			case SBX_NET_MSG_CONNECT:
				REQUIRE(m.value >= 1 && m.value <= 65535 && (m.id & 0x80000000u));
				break;
			case SBX_NET_MSG_OPENED:
				REQUIRE(m.value <= SBX_NET_STATUS_MAX);
				REQUIRE(m.len <= SBX_NET_MESSAGE_MAX);
				REQUIRE(!(m.id & 0x80000000u));
				break;
			case SBX_NET_MSG_CLOSE:
				REQUIRE(m.value <= SBX_NET_CLOSE_RESET);
				break;
			case SBX_NET_MSG_SHUTDOWN:
				REQUIRE(f.payload_len == 0);
				break;
			default:
				REQUIRE(0); /* no other type is accepted */
			}
		}
		if (rc < 0)
			break;
	}
	sbx_reader_free(&rd);
}

static void net_config(const uint8_t *data, size_t size)
{
	static struct sbx_net_config c;
	const char *why = NULL;
	int rc = sbx_net_parse_config(data, size, &c, &why);
	if (rc < 0) {
		REQUIRE((rc == -EPROTO || rc == -EMSGSIZE) && why && why[0]);
		return;
	}
	REQUIRE(c.name_count <= SBX_NET_NAMES_MAX && c.port_count <= SBX_NET_EXTRA_PORTS_MAX);
	REQUIRE(!(c.flags & ~(uint32_t)(SBX_NET_CONFIG_OUTBOUND | SBX_NET_CONFIG_REATTACH)));
	for (uint32_t i = 0; i < c.name_count; i++) {
		REQUIRE(inside(c.names[i], c.name_len[i], data, size));
		REQUIRE((c.name_len[i] == 1 && c.names[i][0] == '*') ||
			sbx_net_name_valid(c.names[i], c.name_len[i]));
	}
	for (uint32_t i = 0; i < c.port_count; i++) {
		REQUIRE(c.ports[i] >= 1 && c.ports[i] != 80 && c.ports[i] != 443);
		for (uint32_t k = 0; k < i; k++)
			REQUIRE(c.ports[k] != c.ports[i]);
	}
	REQUIRE(c.ca_len <= SBX_NET_CA_BUNDLE_MAX && inside(c.ca_bundle, c.ca_len, data, size));
	REQUIRE(!c.ca_bundle || !memchr(c.ca_bundle, 0, c.ca_len));
}

static void dns_queries(const uint8_t *data, size_t size, uint32_t seed)
{
	static struct sbx_name_table t;
	static const uint8_t n1[] = "allowed.test", n2[] = "x";
	struct sbx_net_config cfg = {.flags = SBX_NET_CONFIG_OUTBOUND, .name_count = 2};
	cfg.names[0] = n1;
	cfg.name_len[0] = sizeof(n1) - 1;
	cfg.names[1] = n2;
	cfg.name_len[1] = 1;
	if (seed & 2) {
		static const uint8_t star[] = "*";
		cfg.names[1] = star;
		cfg.name_len[1] = 1;
	}
	memset(&t, 0, sizeof(t));
	size_t off = 0;
	while (off < size) {
		seed = seed * 1103515245u + 12345u;
		size_t qn = (seed >> 8) % 600;
		if (qn > size - off)
			qn = size - off;
		uint8_t out[SBX_DNS_MSG_MAX];
		int entry = -2;
		uint32_t before = t.count;
		size_t n = sbx_dns_answer(&cfg, &t, data + off, qn, out, sizeof(out), &entry);
		REQUIRE(n <= sizeof(out));
		REQUIRE(n == 0 || n >= 12);
		if (n)
			REQUIRE(out[0] == data[off] && out[1] == data[off + 1] && (out[2] & 0x80));
		REQUIRE(t.count <= SBX_NET_TABLE_MAX);
		if (entry >= 0)
			REQUIRE((uint32_t)entry == before && t.count == before + 1 &&
				sbx_net_name_valid((const uint8_t *)t.names[entry], t.len[entry]));
		else
			REQUIRE(entry == -1 && t.count == before);
		off += qn ? qn : 1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 3)
		return 0;
	uint8_t mode = data[0] % 3;
	uint32_t seed = (uint32_t)data[1] << 8 | data[2];
	data += 3;
	size -= 3;
	if (mode == 0)
		net_port_stream(data, size, seed);
	else if (mode == 1)
		net_config(data, size);
	else
		dns_queries(data, size, seed);
	return 0;
}
