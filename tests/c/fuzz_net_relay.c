/* libFuzzer target: arbitrary guest bytes on the NET port through the host's decoder and stream
 * state machine (net_wire.c, net_relay.c), split at pseudo-random points like the port's reads.
 * Every OPEN the relay reports is accepted with a socketpair, so that DATA, CREDIT, SHUTDOWN and
 * CLOSE reach live streams. Streams whose id has bit 1 clear get a peer closed at once (sends
 * fail); the others a peer that never reads, behind a small send buffer, so that sends stall and
 * the guest's uncredited DATA piles up to the window and past it (an overrun; the target is built
 * with a window that fits in -max_len). After each input the peers and the relay are closed, and
 * the relay must free everything.
 *
 * Input layout: 2 bytes seed for the split points, then the byte stream. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net_wire.h"
#include "net_relay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                        \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

static struct sbx_net_ring *ring;
static struct sbx_err E; /* the calls' explanations; the target checks their codes */
static int peers[SBX_NET_STREAMS_MAX];
static size_t n_peers;

static void close_peers(void)
{
	while (n_peers > 0)
		close(peers[--n_peers]);
}

static void drain_events(uint32_t relay)
{
	struct sbx_net_event ev;
	while (sbx_net_ring_next_event(ring, &ev) == 1) {
		REQUIRE(ev.relay == relay);
		if (ev.kind == SBX_NET_EV_OPEN) {
			size_t n = strlen(ev.text);
			REQUIRE(sbx_net_name_ok((const uint8_t *)ev.text, (uint32_t)n));
			REQUIRE(ev.port >= 1 && ev.port <= 65535);
			REQUIRE(!(ev.stream & 0x80000000u) && ev.stream != 0);
			int sv[2];
			if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
				int small = 4096;
				if ((ev.stream & 2) && n_peers < SBX_NET_STREAMS_MAX &&
				    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) == 0)
					peers[n_peers++] = sv[1];
				else
					close(sv[1]);
				int rc = sbx_net_open_reply(ring, relay, ev.stream, SBX_NET_OK, NULL, 0,
							    sv[0], &E);
				REQUIRE(rc == 0 || rc == -ENOENT);
			}
		} else if (ev.kind == SBX_NET_EV_GUEST_REFUSED) {
			/* Only what the decoder let through, summed within its bound. */
			size_t n = strlen(ev.text);
			REQUIRE(ev.stream == 0 && ev.count >= 1);
			if (ev.status == SBX_NET_REFUSAL_NAME)
				REQUIRE(ev.port == 0 && ev.count == 1 &&
					sbx_net_name_ok((const uint8_t *)ev.text, (uint32_t)n));
			else if (ev.status == SBX_NET_REFUSAL_ADDRESS)
				REQUIRE(ev.port >= 1 && ev.port <= 65535 && ev.count == 1 &&
					sbx_net_address_ok((const uint8_t *)ev.text, (uint32_t)n));
			else
				REQUIRE(ev.status == SBX_NET_REFUSAL_DROPPED && ev.port == 0 && n == 0);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!ring && sbx_net_ring_new(512, &ring, &E) < 0)
		__builtin_trap();
	if (size < 2)
		return 0;
	uint32_t seed = (uint32_t)data[0] | (uint32_t)data[1] << 8;
	data += 2;
	size -= 2;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	uint32_t relay;
	REQUIRE(sbx_net_relay_add(ring, sv[0], &relay, &E) == 0);
	size_t off = 0;
	while (off < size) {
		seed = seed * 1103515245u + 12345u;
		size_t n = 1 + (seed >> 8) % (SBX_NET_FRAME_MAX + 12u); /* one port read at most */
		if (n > size - off)
			n = size - off;
		REQUIRE(sbx_net_relay_ingest(ring, relay, data + off, n, &E) == 0);
		sbx_net_ring_run(ring, &E);
		drain_events(relay);
		off += n;
	}
	close_peers(); /* stalled sends end (EPIPE) */
	REQUIRE(sbx_net_relay_close(ring, relay, &E) == 0);
	close(sv[1]);
	for (int i = 0; i < 1000 && sbx_net_ring_live(ring) > 0; i++) {
		sbx_net_ring_run(ring, &E);
		drain_events(relay);
		close_peers(); /* of OPENs drained after the close */
		if (sbx_net_ring_live(ring) > 0)
			usleep(10);
	}
	REQUIRE(sbx_net_ring_live(ring) == 0);
	return 0;
}
