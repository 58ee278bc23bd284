/* The guest's network decoders and DNS stub (guest/src/net_wire_guest.c, dnsstub.c), on the
 * host. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "frame.h"
#include "test.h"
#include "../../guest/src/dnsstub.h"
#include "../../guest/src/net_wire_guest.h"

static bool valid(const char *s)
{
	return sbx_net_name_valid((const uint8_t *)s, strlen(s));
}

static void test_names(void)
{
	CHECK(valid("example.org"));
	CHECK(valid("a-b.c0"));
	CHECK(valid("x"));
	CHECK(!valid(""));
	CHECK(!valid("Example.org")); /* the host sends lowercase (IDNA) */
	CHECK(!valid("a..b"));
	CHECK(!valid(".a"));
	CHECK(!valid("a."));
	CHECK(!valid("-a.b"));
	CHECK(!valid("a-.b"));
	CHECK(!valid("a_b.c"));
	CHECK(!valid("a b"));
	char label[70];
	memset(label, 'a', 64);
	label[64] = '\0';
	CHECK(!valid(label)); /* a 64-byte label */
	label[63] = '\0';
	CHECK(valid(label));
	char longname[300];
	memset(longname, 'a', sizeof(longname));
	for (int i = 50; i < 299; i += 51)
		longname[i] = '.';
	longname[254] = '\0';
	CHECK(!valid(longname)); /* 254 bytes */
}

static struct sbx_buf config(uint32_t flags, const char *const *names, unsigned n,
			     const uint32_t *ports, unsigned np, const char *ca)
{
	struct sbx_buf b = {0};
	sbx_put_u32(&b, flags);
	sbx_put_u32(&b, n);
	for (unsigned i = 0; i < n; i++)
		sbx_put_str(&b, names[i], strlen(names[i]));
	sbx_put_u32(&b, np);
	for (unsigned i = 0; i < np; i++)
		sbx_put_u32(&b, ports[i]);
	sbx_put_str(&b, ca, strlen(ca));
	return b;
}

static void test_config(void)
{
	static struct sbx_net_config c;
	const char *why = NULL;
	const char *names[] = {"example.org", "*"};
	const uint32_t ports[] = {8080, 80, 443, 8080, 22};
	struct sbx_buf b = config(SBX_NET_CONFIG_OUTBOUND, names, 2, ports, 5, "PEM");
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), 0);
	CHECK_EQ(c.flags, SBX_NET_CONFIG_OUTBOUND);
	CHECK_EQ(c.name_count, 2);
	CHECK(c.name_len[0] == 11 && memcmp(c.names[0], "example.org", 11) == 0);
	CHECK_EQ(c.port_count, 2); /* 80, 443 and the repeated 8080 dropped */
	CHECK(c.ports[0] == 8080 && c.ports[1] == 22);
	CHECK(c.ca_len == 3 && memcmp(c.ca_bundle, "PEM", 3) == 0);
	/* truncated anywhere, or a byte too many */
	for (size_t n = 0; n < b.len; n++)
		CHECK(sbx_net_parse_config(b.data, n, &c, &why) < 0);
	sbx_buf_append(&b, "x", 1);
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), -EPROTO);
	CHECK_STR(why, "trailing bytes");
	sbx_buf_free(&b);

	b = config(0, NULL, 0, NULL, 0, "");
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), 0);
	CHECK(c.ca_bundle == NULL && c.name_count == 0);
	sbx_buf_free(&b);

	b = config(SBX_NET_CONFIG_OUTBOUND | SBX_NET_CONFIG_REATTACH, NULL, 0, NULL, 0, "");
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), 0);
	CHECK_EQ(c.flags, SBX_NET_CONFIG_OUTBOUND | SBX_NET_CONFIG_REATTACH);
	sbx_buf_free(&b);
	b = config(4, NULL, 0, NULL, 0, ""); /* no such flag */
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), -EPROTO);
	sbx_buf_free(&b);
	const char *bad[] = {"Example.org"};
	b = config(1, bad, 1, NULL, 0, "");
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), -EPROTO);
	CHECK_STR(why, "invalid name");
	sbx_buf_free(&b);
	const uint32_t zero[] = {0};
	b = config(1, NULL, 0, zero, 1, "");
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), -EPROTO);
	sbx_buf_free(&b);
	b = (struct sbx_buf){0};
	sbx_put_u32(&b, 1);
	sbx_put_u32(&b, SBX_NET_NAMES_MAX + 1);
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), -EMSGSIZE);
	sbx_buf_free(&b);
	b = (struct sbx_buf){0};
	sbx_put_u32(&b, 1);
	sbx_put_u32(&b, 0);
	sbx_put_u32(&b, 0);
	sbx_put_str(&b, "a\0b", 3);
	CHECK_EQ(sbx_net_parse_config(b.data, b.len, &c, &why), -EPROTO);
	CHECK_STR(why, "NUL in the CA bundle");
	sbx_buf_free(&b);
}

static void test_allowed(void)
{
	struct sbx_net_config c = {.name_count = 1};
	c.names[0] = (const uint8_t *)"example.org";
	c.name_len[0] = 11;
#define ALLOWED(s) sbx_net_name_allowed(&c, (const uint8_t *)(s), strlen(s))
	CHECK(ALLOWED("example.org"));
	CHECK(ALLOWED("api.example.org"));
	CHECK(ALLOWED("a.b.example.org"));
	CHECK(!ALLOWED("xexample.org"));
	CHECK(!ALLOWED("example.org.evil"));
	CHECK(!ALLOWED("org"));
	c.names[1] = (const uint8_t *)"*";
	c.name_len[1] = 1;
	c.name_count = 2;
	CHECK(ALLOWED("anything.else"));
#undef ALLOWED
}

static int host_frame(uint8_t type, uint32_t id, const void *p, uint32_t n,
		      struct sbx_net_host_msg *m)
{
	struct sbx_frame f = {.type = type, .id = id, .payload = p, .payload_len = n};
	const char *why = NULL;
	return sbx_net_parse_host_frame(&f, m, &why);
}

static void test_host_frames(void)
{
	struct sbx_net_host_msg m;
	uint8_t p[16] = {0};
	uint8_t data[SBX_NET_DATA_MAX + 1];
	memset(data, 'x', sizeof(data));
	/* OPENED: status + str reason, for a guest stream only */
	uint8_t opened[] = {1, 0, 0, 0, 2, 0, 0, 0, 'n', 'o'};
	CHECK_EQ(host_frame(SBX_NET_MSG_OPENED, 5, opened, sizeof(opened), &m), 0);
	CHECK(m.value == 1 && m.len == 2 && memcmp(m.data, "no", 2) == 0);
	CHECK_EQ(host_frame(SBX_NET_MSG_OPENED, 0x80000005u, opened, sizeof(opened), &m), -EPROTO);
	CHECK_EQ(host_frame(SBX_NET_MSG_OPENED, 5, opened, sizeof(opened) - 1, &m), -EPROTO);
	opened[0] = SBX_NET_STATUS_MAX + 1;
	CHECK_EQ(host_frame(SBX_NET_MSG_OPENED, 5, opened, sizeof(opened), &m), -EPROTO);
	/* CONNECT: a host id and a port */
	uint8_t port[] = {0x40, 0x1f, 0, 0}; /* 8000 */
	CHECK_EQ(host_frame(SBX_NET_MSG_CONNECT, 0x80000001u, port, 4, &m), 0);
	CHECK_EQ(m.value, 8000);
	CHECK_EQ(host_frame(SBX_NET_MSG_CONNECT, 1, port, 4, &m), -EPROTO);
	CHECK_EQ(host_frame(SBX_NET_MSG_CONNECT, 0x80000001u, p, 4, &m), -EPROTO); /* port 0 */
	uint8_t big_port[] = {0, 0, 1, 0};
	CHECK_EQ(host_frame(SBX_NET_MSG_CONNECT, 0x80000001u, big_port, 4, &m), -EPROTO);
	/* DATA: 1..SBX_NET_DATA_MAX */
	CHECK_EQ(host_frame(SBX_NET_MSG_DATA, 3, data, SBX_NET_DATA_MAX, &m), 0);
	CHECK_EQ(host_frame(SBX_NET_MSG_DATA, 3, data, SBX_NET_DATA_MAX + 1, &m), -EPROTO);
	CHECK_EQ(host_frame(SBX_NET_MSG_DATA, 3, data, 0, &m), -EPROTO);
	CHECK_EQ(host_frame(SBX_NET_MSG_DATA, 0, data, 1, &m), -EPROTO); /* id 0 */
	/* CREDIT: 1..window */
	uint8_t credit[] = {(uint8_t)SBX_NET_WINDOW, (uint8_t)(SBX_NET_WINDOW >> 8),
			    (uint8_t)(SBX_NET_WINDOW >> 16), (uint8_t)(SBX_NET_WINDOW >> 24)};
	CHECK_EQ(host_frame(SBX_NET_MSG_CREDIT, 3, credit, 4, &m), 0);
	credit[0] = (uint8_t)(credit[0] + 1); /* window + 1 */
	CHECK_EQ(host_frame(SBX_NET_MSG_CREDIT, 3, credit, 4, &m), -EPROTO);
	CHECK_EQ(host_frame(SBX_NET_MSG_CREDIT, 3, p, 4, &m), -EPROTO);
	/* SHUTDOWN: empty; CLOSE: 0 or 1 */
	CHECK_EQ(host_frame(SBX_NET_MSG_SHUTDOWN, 3, NULL, 0, &m), 0);
	CHECK_EQ(host_frame(SBX_NET_MSG_SHUTDOWN, 3, p, 1, &m), -EPROTO);
	uint8_t close1[] = {1, 0, 0, 0}, close2[] = {2, 0, 0, 0};
	CHECK_EQ(host_frame(SBX_NET_MSG_CLOSE, 3, close1, 4, &m), 0);
	CHECK_EQ(host_frame(SBX_NET_MSG_CLOSE, 3, close2, 4, &m), -EPROTO);
	/* guest -> host types and anything else */
	CHECK_EQ(host_frame(SBX_NET_MSG_OPEN, 3, p, 8, &m), -EPROTO);
	CHECK_EQ(host_frame(SBX_NET_MSG_CONNECTED, 3, p, 4, &m), -EPROTO);
	CHECK_EQ(host_frame(7, 3, p, 4, &m), -EPROTO);
}

/* A DNS query for name/qtype, with a few knobs for broken ones. */
static size_t query(uint8_t *q, const char *name, uint16_t qtype, uint16_t flags, uint16_t qd)
{
	uint8_t *p = q;
	*p++ = 0xab;
	*p++ = 0xcd;
	*p++ = (uint8_t)(flags >> 8);
	*p++ = (uint8_t)flags;
	*p++ = 0;
	*p++ = (uint8_t)qd;
	memset(p, 0, 6);
	p += 6;
	const char *s = name;
	while (*s) {
		const char *dot = strchr(s, '.');
		size_t l = dot ? (size_t)(dot - s) : strlen(s);
		*p++ = (uint8_t)l;
		memcpy(p, s, l);
		p += l;
		s += l + (dot ? 1 : 0);
	}
	*p++ = 0;
	*p++ = (uint8_t)(qtype >> 8);
	*p++ = (uint8_t)qtype;
	*p++ = 0;
	*p++ = 1;
	return (size_t)(p - q);
}

static unsigned rcode(const uint8_t *r)
{
	return r[3] & 0xf;
}

static unsigned ancount(const uint8_t *r)
{
	return (unsigned)(r[6] << 8 | r[7]);
}

static void test_dns(void)
{
	static struct sbx_name_table t;
	struct sbx_net_config c = {.flags = SBX_NET_CONFIG_OUTBOUND, .name_count = 1};
	c.names[0] = (const uint8_t *)"allowed.test";
	c.name_len[0] = 12;
	uint8_t q[600], r[SBX_DNS_MSG_MAX];
	int entry;

	size_t qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x0100, 1);
	size_t n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK_EQ(n, qn + 16);
	CHECK(r[0] == 0xab && r[1] == 0xcd && (r[2] & 0x80) && (r[2] & 0x01)); /* QR, RD echoed */
	CHECK_EQ(rcode(r), 0);
	CHECK_EQ(ancount(r), 1);
	CHECK_EQ(entry, 0);
	CHECK(r[n - 4] == 198 && r[n - 3] == 18 && r[n - 2] == 0 && r[n - 1] == 1);
	/* a second name: the next address; the first again (case aside): its own address, no new
	 * entry */
	qn = query(q, "www.allowed.test", SBX_DNS_TYPE_A, 0x0100, 1);
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(entry == 1 && r[n - 1] == 2);
	qn = query(q, "ALLOWED.Test", SBX_DNS_TYPE_A, 0x0100, 1);
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(entry == -1 && r[n - 1] == 1);
	CHECK(memcmp(r + 13, "ALLOWED", 7) == 0); /* the question as asked */
	const char *name;
	size_t len;
	CHECK_EQ(sbx_name_table_find_addr(&t, 0xC6120002u, &name, &len), 0);
	CHECK(len == 16 && strcmp(name, "www.allowed.test") == 0);
	CHECK_EQ(sbx_name_table_find_addr(&t, 0xC6120003u, &name, &len), -ENOENT);
	CHECK_EQ(sbx_name_table_find_addr(&t, 0xC6120000u, &name, &len), -ENOENT);
	CHECK_EQ(sbx_name_table_find_addr(&t, 0x7f000001u, &name, &len), -ENOENT);

	/* AAAA and other types of an allowed name: empty NOERROR */
	qn = query(q, "allowed.test", SBX_DNS_TYPE_AAAA, 0x0100, 1);
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(n == qn && rcode(r) == 0 && ancount(r) == 0);
	qn = query(q, "allowed.test", 65, 0x0100, 1);
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(n == qn && rcode(r) == 0 && ancount(r) == 0);
	/* other names, names the protocol cannot carry: NXDOMAIN */
	const char *refused[] = {"xallowed.test", "other.example", "a_b.allowed.test", "test"};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		qn = query(q, refused[i], SBX_DNS_TYPE_A, 0x0100, 1);
		n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
		CHECK(n == qn && rcode(r) == SBX_DNS_NXDOMAIN && ancount(r) == 0 && entry == -1);
	}
	/* outbound off: nothing resolves */
	c.flags = 0;
	qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x0100, 1);
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(rcode(r) == SBX_DNS_NXDOMAIN && ancount(r) == 0);
	c.flags = SBX_NET_CONFIG_OUTBOUND;

	/* broken queries */
	CHECK_EQ(sbx_dns_answer(&c, &t, q, 11, r, sizeof(r), &entry), 0); /* no header */
	qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x8100, 1);
	CHECK_EQ(sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry), 0); /* a response */
	qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x0900, 1); /* opcode 1 */
	CHECK_EQ(sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry), 12);
	CHECK_EQ(rcode(r), SBX_DNS_NOTIMP);
	qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x0100, 2);
	CHECK_EQ(sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry), 12);
	CHECK_EQ(rcode(r), SBX_DNS_FORMERR);
	qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x0100, 1);
	CHECK_EQ(sbx_dns_answer(&c, &t, q, qn - 1, r, sizeof(r), &entry), 12); /* truncated */
	CHECK_EQ(rcode(r), SBX_DNS_FORMERR);
	q[12] = 0xC0; /* a compression pointer in the question */
	CHECK_EQ(sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry), 12);
	CHECK_EQ(rcode(r), SBX_DNS_FORMERR);
	qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x0100, 1);
	q[qn - 1] = 3; /* class CH */
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(rcode(r) == SBX_DNS_NOTIMP && ancount(r) == 0);
	memset(q + 12, 'a', sizeof(q) - 12);
	CHECK_EQ(sbx_dns_answer(&c, &t, q, sizeof(q), r, sizeof(r), &entry), 12); /* > 512 */
	CHECK_EQ(rcode(r), SBX_DNS_FORMERR);

	/* a full table: SERVFAIL, nothing overwritten */
	c.names[0] = (const uint8_t *)"*";
	c.name_len[0] = 1;
	for (unsigned i = t.count; i < SBX_NET_TABLE_MAX; i++) {
		char nm[32];
		snprintf(nm, sizeof(nm), "n%u.example", i);
		qn = query(q, nm, SBX_DNS_TYPE_A, 0x0100, 1);
		sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
		CHECK_EQ(entry, (int)i);
	}
	qn = query(q, "one.more", SBX_DNS_TYPE_A, 0x0100, 1);
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(rcode(r) == SBX_DNS_SERVFAIL && ancount(r) == 0 && entry == -1);
	qn = query(q, "allowed.test", SBX_DNS_TYPE_A, 0x0100, 1); /* known names still answer */
	n = sbx_dns_answer(&c, &t, q, qn, r, sizeof(r), &entry);
	CHECK(rcode(r) == 0 && r[n - 1] == 1);
}

/* The names the stub refuses for the policy alone are the ones reported to the host. */
static void test_dns_refused_names(void)
{
	struct sbx_net_config c = {.flags = SBX_NET_CONFIG_OUTBOUND, .name_count = 1};
	c.names[0] = (const uint8_t *)"allowed.test";
	c.name_len[0] = 12;
	uint8_t q[600];
	char name[SBX_NET_NAME_MAX + 1];
	size_t len;
	size_t qn = query(q, "Blocked.Example", SBX_DNS_TYPE_AAAA, 0x0100, 1);
	CHECK(sbx_dns_refused_name(&c, q, qn, name, &len));
	CHECK(len == 15 && strcmp(name, "blocked.example") == 0);
	qn = query(q, "www.allowed.test", SBX_DNS_TYPE_A, 0x0100, 1);
	CHECK(!sbx_dns_refused_name(&c, q, qn, name, &len)); /* allowed */
	qn = query(q, "bad_name.example", SBX_DNS_TYPE_A, 0x0100, 1);
	CHECK(!sbx_dns_refused_name(&c, q, qn, name, &len)); /* not a name the port carries */
	qn = query(q, "blocked.example", SBX_DNS_TYPE_A, 0x8100, 1);
	CHECK(!sbx_dns_refused_name(&c, q, qn, name, &len)); /* a response */
	qn = query(q, "blocked.example", SBX_DNS_TYPE_A, 0x0100, 1);
	CHECK(!sbx_dns_refused_name(&c, q, qn - 1, name, &len)); /* truncated */
	c.flags = 0;
	CHECK(!sbx_dns_refused_name(&c, q, qn, name, &len)); /* no outbound: nothing to report */
}

int main(void)
{
	RUN(test_names);
	RUN(test_config);
	RUN(test_allowed);
	RUN(test_host_frames);
	RUN(test_dns);
	RUN(test_dns_refused_names);
	TEST_MAIN_END("test_guest_net");
}
