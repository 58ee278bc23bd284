/* The DNS stub's logic: a UDP query in, a reply out, and the table of synthetic addresses.
 * Pure: no I/O (net_dns.c owns the socket), so that the host tests and the fuzzer
 * (tests/c/fuzz_guest_net.c) drive it directly; user code is hostile to the agent too, and any
 * process in the guest can send this parser anything.
 *
 * Answers: an allowed name (net_wire_guest.h's patterns) gets one A record with its synthetic
 * address, stable for the VM's life; AAAA and every other type of an allowed name an empty
 * NOERROR (clients then use the A record); any other name NXDOMAIN; a full table SERVFAIL; a
 * query that is not a plain one-question standard query FORMERR, or nothing when not even the
 * header is there. */
#ifndef SBX_DNSSTUB_H
#define SBX_DNSSTUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net_wire_guest.h"

#define SBX_DNS_MSG_MAX 512u /* classic UDP DNS: glibc's and Node's queries fit */
/* Names with a synthetic address. Each costs a listener per outbound port (net_listen.c), so the
 * table is small; a name past it gets SERVFAIL. */
#define SBX_NET_TABLE_MAX 128u
#define SBX_DNS_TTL 300u

enum {
	SBX_DNS_NOERROR = 0,
	SBX_DNS_FORMERR = 1,
	SBX_DNS_SERVFAIL = 2,
	SBX_DNS_NXDOMAIN = 3,
	SBX_DNS_NOTIMP = 4,
	SBX_DNS_TYPE_A = 1,
	SBX_DNS_TYPE_AAAA = 28,
	SBX_DNS_CLASS_IN = 1,
};

struct sbx_name_table {
	uint32_t count;
	uint8_t len[SBX_NET_TABLE_MAX];
	char names[SBX_NET_TABLE_MAX][SBX_NET_NAME_MAX + 1];
};

/* The address of entry i: 198.18.0.1 onwards (host byte order). */
uint32_t sbx_name_table_addr(uint32_t i);
/* The name with address addr (host byte order): 0 with *name and *n, or -ENOENT. */
int sbx_name_table_find_addr(const struct sbx_name_table *t, uint32_t addr, const char **name,
			     size_t *n);
/* The entry of name, added if new: its index, or -ENOSPC when the table is full. *added says
 * whether it is new (the caller then opens its listeners). */
int sbx_name_table_get(struct sbx_name_table *t, const char *name, size_t n, bool *added);

/* Answer one query of qn bytes into out (cap >= SBX_DNS_MSG_MAX). Returns the reply's length, or 0
 * when nothing should be sent. *new_entry: the table index a name was just given, else -1. */
size_t sbx_dns_answer(const struct sbx_net_config *cfg, struct sbx_name_table *t,
		      const uint8_t *q, size_t qn, uint8_t *out, size_t cap, int *new_entry);
/* Whether sbx_dns_answer refuses query q (qn bytes) because its name, one the net port could
 * carry, is not allowed (outbound on, class IN, NXDOMAIN for the policy alone): then the name is
 * in name (SBX_NET_NAME_MAX + 1 bytes), *name_len bytes, for the host's log (NET_REFUSED). */
bool sbx_dns_refused_name(const struct sbx_net_config *cfg, const uint8_t *q, size_t qn,
			  char *name, size_t *name_len);

#endif /* SBX_DNSSTUB_H */
