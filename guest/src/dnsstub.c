/* The DNS stub's logic: see dnsstub.h. Every offset is checked against the query's length before
 * it is read; nothing of the query is trusted. */
#include "dnsstub.h"

#include <errno.h>
#include <string.h>

#define HEADER 12u
#define FLAG_QR 0x8000u
#define FLAG_AA 0x0400u
#define FLAG_RD 0x0100u
#define FLAG_RA 0x0080u

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static void put16(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

uint32_t sbx_name_table_addr(uint32_t i)
{
	return SBX_NET_SYNTHETIC_BASE + 1u + i;
}

int sbx_name_table_find_addr(const struct sbx_name_table *t, uint32_t addr, const char **name,
			     size_t *n)
{
	uint32_t i = addr - SBX_NET_SYNTHETIC_BASE - 1u; /* wraps to a huge index below the base */
	if (i >= t->count)
		return -ENOENT;
	*name = t->names[i];
	*n = t->len[i];
	return 0;
}

int sbx_name_table_get(struct sbx_name_table *t, const char *name, size_t n, bool *added)
{
	*added = false;
	if (n == 0 || n > SBX_NET_NAME_MAX)
		return -EINVAL;
	for (uint32_t i = 0; i < t->count; i++)
		if (t->len[i] == n && memcmp(t->names[i], name, n) == 0)
			return (int)i;
	if (t->count >= SBX_NET_TABLE_MAX)
		return -ENOSPC;
	uint32_t i = t->count++;
	memcpy(t->names[i], name, n);
	t->names[i][n] = '\0';
	t->len[i] = (uint8_t)n;
	*added = true;
	return (int)i;
}

/* A reply of just the header (and no question): for queries too broken to echo. */
static size_t header_only(const uint8_t *q, uint8_t *out, unsigned rcode)
{
	memset(out, 0, HEADER);
	out[0] = q[0];
	out[1] = q[1];
	put16(out + 2, FLAG_QR | (get16(q + 2) & (0x7800u | FLAG_RD)) | FLAG_RA | rcode);
	return HEADER;
}

/* The question's name at q[12..], lowercased and dotted into name (SBX_NET_NAME_MAX + 1 bytes).
 * Returns the offset past the name, or 0 if it is malformed (compression, overrun, too long).
 * *valid: whether the name is one the protocol can carry (net_wire_guest.h); others get
 * NXDOMAIN. */
static size_t read_qname(const uint8_t *q, size_t qn, char *name, size_t *name_len, bool *valid)
{
	size_t off = HEADER, len = 0;
	*valid = true;
	for (;;) {
		if (off >= qn)
			return 0;
		uint8_t l = q[off++];
		if (l == 0)
			break;
		if (l & 0xC0)
			return 0; /* a pointer (or the reserved forms): a question has none */
		if (l > qn - off || len + (len ? 1u : 0u) + l > SBX_NET_NAME_MAX)
			return 0;
		if (len)
			name[len++] = '.';
		for (uint8_t k = 0; k < l; k++) {
			uint8_t c = q[off++];
			if (c >= 'A' && c <= 'Z')
				c = (uint8_t)(c + ('a' - 'A'));
			if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
				*valid = false;
			name[len++] = (char)c;
		}
	}
	name[len] = '\0';
	*name_len = len;
	if (!sbx_net_name_valid((const uint8_t *)name, len))
		*valid = false;
	return off;
}

bool sbx_dns_refused_name(const struct sbx_net_config *cfg, const uint8_t *q, size_t qn,
			  char *name, size_t *name_len)
{
	if (qn < HEADER || qn > SBX_DNS_MSG_MAX || !(cfg->flags & SBX_NET_CONFIG_OUTBOUND))
		return false;
	uint16_t flags = get16(q + 2);
	if ((flags & FLAG_QR) || ((flags >> 11) & 0xF) || get16(q + 4) != 1 || get16(q + 6) != 0 ||
	    get16(q + 8) != 0 || get16(q + 10) > 1)
		return false;
	bool valid;
	size_t off = read_qname(q, qn, name, name_len, &valid);
	if (off == 0 || qn - off < 4 || off + 16 > SBX_DNS_MSG_MAX || !valid ||
	    get16(q + off + 2) != SBX_DNS_CLASS_IN)
		return false;
	return !sbx_net_name_allowed(cfg, (const uint8_t *)name, *name_len);
}

size_t sbx_dns_answer(const struct sbx_net_config *cfg, struct sbx_name_table *t,
		      const uint8_t *q, size_t qn, uint8_t *out, size_t cap, int *new_entry)
{
	*new_entry = -1;
	if (qn < HEADER || cap < SBX_DNS_MSG_MAX)
		return 0;
	uint16_t flags = get16(q + 2);
	if (flags & FLAG_QR)
		return 0; /* a response: never answer one (no loops between two stubs) */
	if (qn > SBX_DNS_MSG_MAX)
		return header_only(q, out, SBX_DNS_FORMERR);
	if ((flags >> 11) & 0xF)
		return header_only(q, out, SBX_DNS_NOTIMP); /* only standard queries */
	/* One question, no answers or authority; an EDNS OPT record in the additional section is
	 * ignored (the reply carries none, which a client takes as no EDNS). */
	if (get16(q + 4) != 1 || get16(q + 6) != 0 || get16(q + 8) != 0 || get16(q + 10) > 1)
		return header_only(q, out, SBX_DNS_FORMERR);
	char name[SBX_NET_NAME_MAX + 1];
	size_t name_len = 0;
	bool valid;
	size_t off = read_qname(q, qn, name, &name_len, &valid);
	if (off == 0 || qn - off < 4)
		return header_only(q, out, SBX_DNS_FORMERR);
	uint16_t qtype = get16(q + off), qclass = get16(q + off + 2);
	off += 4;
	/* The reply: the header, the question as sent (its case too: some clients check it), and
	 * at most one 16-byte answer. off <= SBX_DNS_MSG_MAX - 16 is not guaranteed: check. */
	if (off + 16 > cap)
		return header_only(q, out, SBX_DNS_FORMERR);
	unsigned rcode = SBX_DNS_NOERROR;
	uint32_t addr = 0;
	bool allowed = valid && (cfg->flags & SBX_NET_CONFIG_OUTBOUND) &&
		       sbx_net_name_allowed(cfg, (const uint8_t *)name, name_len);
	if (qclass != SBX_DNS_CLASS_IN)
		rcode = SBX_DNS_NOTIMP;
	else if (!allowed)
		rcode = SBX_DNS_NXDOMAIN;
	else if (qtype == SBX_DNS_TYPE_A) {
		bool added;
		int i = sbx_name_table_get(t, name, name_len, &added);
		if (i < 0) {
			rcode = SBX_DNS_SERVFAIL;
		} else {
			addr = sbx_name_table_addr((uint32_t)i);
			if (added)
				*new_entry = i;
		}
	}
	memcpy(out, q, off);
	put16(out + 2, FLAG_QR | FLAG_AA | (flags & FLAG_RD) | FLAG_RA | rcode);
	put16(out + 6, addr ? 1 : 0);
	put16(out + 8, 0);
	put16(out + 10, 0);
	if (!addr)
		return off;
	uint8_t *a = out + off;
	put16(a, 0xC000u | HEADER); /* the name: a pointer to the question's */
	put16(a + 2, SBX_DNS_TYPE_A);
	put16(a + 4, SBX_DNS_CLASS_IN);
	put16(a + 6, 0);
	put16(a + 8, SBX_DNS_TTL);
	put16(a + 10, 4);
	a[12] = (uint8_t)(addr >> 24);
	a[13] = (uint8_t)(addr >> 16);
	a[14] = (uint8_t)(addr >> 8);
	a[15] = (uint8_t)addr;
	return off + 16;
}
