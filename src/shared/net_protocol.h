/* exec-sandbox network protocol: how a guest with NO network device reaches the outside
 * by name, and how the host reaches a port inside the guest. Shared by the host (src/_execsbx) and
 * the guest agent (guest/). Plain C, no Python. docs/protocol.md explains it; this is the one
 * definition.
 *
 * Two transports carry it:
 *
 *  1. The agent channel (protocol.h) carries the one control message, NET_CONFIG, host -> guest,
 *     answered by PONG (or ERROR). It is sent before any user code runs in a VM that has the
 *     network port (after RESEED for a restored VM).
 *
 *  2. A second virtio-serial port, SBX_NET_PORT_NAME, present only in VMs started with network or
 *     exposed ports (its presence is part of the device layout, hence of the L1 snapshot key). It
 *     carries only stream frames, in the frame format of protocol.h (12-byte header, little-endian,
 *     reserved bytes 0); the header's id is the STREAM ID. The host's decoder for this port accepts
 *     only the guest -> host types below and payloads of at most SBX_NET_FRAME_MAX bytes.
 *
 * Stream ids: the guest opens streams with ids 1..0x7fffffff (bit 31 clear), the host with ids
 * 0x80000000..0xffffffff (bit 31 set). Id 0 is never a stream. An opener never reuses an id that
 * is still live on its side.
 *
 * Life of a stream:
 *   outbound (guest code connects to a name):   guest NET_OPEN -> host NET_OPENED(status)
 *   inbound (a host client on an exposed port): host NET_CONNECT -> guest NET_CONNECTED(status)
 *   a status other than SBX_NET_OK ends the stream at once (no CLOSE follows).
 *   then, both ways: NET_DATA / NET_CREDIT / NET_SHUTDOWN, and finally NET_CLOSE.
 *   A side sends NET_CLOSE when it is done with the stream (its socket closed, failed or reset); on
 *   receiving NET_CLOSE a side tears down its socket and answers NET_CLOSE if it had not sent one.
 *   The id is free again once a side has both sent and received NET_CLOSE.
 *
 * Flow control (credit-based, per stream and per direction): a sender may have at most
 * SBX_NET_WINDOW bytes of NET_DATA that the receiver has not yet credited back. The receiver sends
 * NET_CREDIT(n) after it has written n bytes to its socket. A guest that overruns a window, credits
 * more than it was sent, opens more than SBX_NET_STREAMS_MAX live streams, uses a host-side id, or
 * sends a frame for a stream that does not exist (other than a late CREDIT/CLOSE for one it has
 * just closed) breaks the protocol: the host kills that VM, like any bad frame on the agent
 * channel. Host memory per VM is thus bounded by SBX_NET_STREAMS_MAX * SBX_NET_WINDOW.
 */
#ifndef SBX_NET_PROTOCOL_H
#define SBX_NET_PROTOCOL_H

#include <stdint.h>

#define SBX_NET_PORT_NAME "org.execsandbox.net.0"

/* Hard limits. */
#define SBX_NET_FRAME_MAX (64u * 1024u)   /* payload of any frame on the net port, both ways */
#define SBX_NET_DATA_MAX (60u * 1024u)    /* bytes in one NET_DATA, 1..this */
/* Uncredited bytes in flight per stream and direction. A stream moves at most a window per credit
 * round trip, and under TCG that trip (guest wake-up, QEMU, the host's loop and back) takes
 * milliseconds: 256 KiB held a stream near 130 MB/s, below what the port carries. Only the fuzz
 * build of the host relay sets another (tests/c/Makefile): a window overrun must fit in an input
 * the fuzzer can make. */
#ifndef SBX_NET_WINDOW
#define SBX_NET_WINDOW (1024u * 1024u)
#endif
#define SBX_NET_STREAMS_MAX 64u           /* live streams per VM, both directions together */
#define SBX_NET_NAME_MAX 253u             /* a DNS name in NET_OPEN / NET_CONFIG, ASCII (IDNA) */
#define SBX_NET_NAMES_MAX 256u            /* names in NET_CONFIG */
#define SBX_NET_EXTRA_PORTS_MAX 16u       /* outbound ports besides 80 and 443 in NET_CONFIG */
#define SBX_NET_EXPOSED_PORTS_MAX 10u     /* exposed ports per VM (the API's limit) */
#define SBX_NET_CA_BUNDLE_MAX (1024u * 1024u)
#define SBX_NET_MESSAGE_MAX 256u          /* the reason text in NET_OPENED */

/* Synthetic addresses (guest side): the DNS stub answers an allowed name with an address of this
 * range, one stable address per name. The agent makes the range local on lo. The host's deny list
 * also contains it. 198.18.0.0/15 is reserved for benchmarking (RFC 2544): never a real peer. */
#define SBX_NET_SYNTHETIC_BASE 0xC6120000u /* 198.18.0.0 */
#define SBX_NET_SYNTHETIC_PREFIX 15u

enum sbx_net_msg {
	/* guest -> host, on the net port (48..63) */
	SBX_NET_MSG_OPEN = 48,      /* u32 port (1..65535), str name (1..SBX_NET_NAME_MAX, lowercase
				     * ASCII letters, digits, '-', '.'). id: a new guest stream id. */
	SBX_NET_MSG_CONNECTED = 49, /* u32 status (enum sbx_net_status): answers NET_CONNECT */
	SBX_NET_MSG_REFUSED = 50,   /* an attempt the guest refused itself, for the host's log: u32
				     * what (enum sbx_net_refusal), u32 port, u32 count, str subject
				     * (see the enum). id: 0 (no stream). The guest sends at most a
				     * few per second (the rest as one REFUSAL_DROPPED); the host
				     * bounds them again, since a guest can send anything. */
	/* host -> guest, on the net port (112..127) */
	SBX_NET_MSG_OPENED = 112,   /* u32 status (enum sbx_net_status), str reason (<= MESSAGE_MAX;
				     * empty when OK). Answers NET_OPEN. */
	SBX_NET_MSG_CONNECT = 113,  /* u32 port inside the guest (1..65535): connect to 127.0.0.1:port.
				     * id: a new host stream id. */
	/* both ways, on the net port (the same numbers in both directions) */
	SBX_NET_MSG_DATA = 120,     /* 1..SBX_NET_DATA_MAX raw bytes of the stream */
	SBX_NET_MSG_CREDIT = 121,   /* u32 bytes (>= 1) the receiver has consumed */
	SBX_NET_MSG_SHUTDOWN = 122, /* empty: the sender will send no more DATA (a half close, FIN) */
	SBX_NET_MSG_CLOSE = 123,    /* u32 0 = done, 1 = reset/error: the stream is gone */

	/* host -> guest, on the AGENT channel (protocol.h numbering, network range 104..111) */
	SBX_MSG_NET_CONFIG = 104,   /* see "NET_CONFIG payload" below; answered by PONG or ERROR */
};

enum sbx_net_status {
	SBX_NET_OK = 0,
	SBX_NET_REFUSED_POLICY = 1,  /* the name (or port) is not allowed: nothing left the host */
	SBX_NET_REFUSED_ADDRESS = 2, /* the name resolved only to denied addresses */
	SBX_NET_RESOLVE_FAILED = 3,  /* the host could not resolve the name */
	SBX_NET_CONNECT_FAILED = 4,  /* the peer refused, was unreachable, or timed out */
	SBX_NET_TOO_MANY = 5,        /* the per-VM stream limit was reached */
};
#define SBX_NET_STATUS_MAX SBX_NET_TOO_MANY

/* What a NET_REFUSED reports. The guest's word: nothing of it is checked beyond its format. */
enum sbx_net_refusal {
	SBX_NET_REFUSAL_NAME = 0,    /* its DNS stub answered NXDOMAIN for a name not allowed:
				      * subject the name (a NET_OPEN name), port 0, count 1 */
	SBX_NET_REFUSAL_ADDRESS = 1, /* a connection to an IPv4 address no allowed name was given
				      * (an IP literal, an unassigned synthetic address) was reset:
				      * subject the address (dotted quad), port 1..65535, count 1 */
	SBX_NET_REFUSAL_DROPPED = 2, /* count (1..SBX_NET_REFUSAL_COUNT_MAX) reports the guest's
				      * rate limit left out; subject empty, port 0 */
};
#define SBX_NET_REFUSAL_MAX SBX_NET_REFUSAL_DROPPED
#define SBX_NET_REFUSAL_COUNT_MAX 1000000000u
#define SBX_NET_ADDRESS_TEXT_MAX 15u /* "255.255.255.255" */

enum sbx_net_close {
	SBX_NET_CLOSE_DONE = 0,
	SBX_NET_CLOSE_RESET = 1,
};

/* NET_CONFIG payload (host -> guest, agent channel, any request id):
 *     u32  flags (enum sbx_net_config_flag)
 *     u32  name count (<= SBX_NET_NAMES_MAX), then per name: str pattern (1..SBX_NET_NAME_MAX)
 *          "example.org" allows that name and its subdomains at a label boundary;
 *          "*" alone (the only wildcard) allows every name: allow_network without allowed_domains
 *     u32  extra port count (<= SBX_NET_EXTRA_PORTS_MAX), then u32 port each (1..65535): outbound
 *          ports the agent accepts on besides 80 and 443 (from "name:port" in allowed_domains)
 *     str  CA bundle, PEM (<= SBX_NET_CA_BUNDLE_MAX; empty: keep the image's bundle)
 * The guest's patterns only shape what its DNS stub answers; the host re-checks every NET_OPEN
 * against its own policy (a guest owns its kernel and can send anything). */
enum sbx_net_config_flag {
	SBX_NET_CONFIG_OUTBOUND = 1u << 0, /* outbound streams allowed (allow_network) */
	/* The VM was restored from a state saved while it had network (a resumed or forked
	 * session): its streams' host ends died with the old host, so the guest resets them all
	 * and takes this configuration although it was configured before. Without it a second
	 * NET_CONFIG is refused. Same outbound flag and extra ports as before, or refused. */
	SBX_NET_CONFIG_REATTACH = 1u << 1,
};

/* What the guest writes on the net port first when it takes a REATTACH, before any frame: the
 * bytes before it are what it had queued for the old host (frames of dead streams, a frame cut
 * by the save), which the host skips (network/attach.py) before it relays the port. Not a frame:
 * a length of 0xffffffff is none. (A guest can put these bytes in a stream's DATA: it then only
 * breaks its own network, as with any bad frame.) */
#define SBX_NET_REATTACH_MARK "\xff\xff\xff\xffsbx-net-reattached\xff\xff\xff\xff"
#define SBX_NET_REATTACH_MARK_LEN 26u

#endif /* SBX_NET_PROTOCOL_H */
