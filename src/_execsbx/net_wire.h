/* Guest -> host frames of the NET port (net_protocol.h) turned into validated records: the one
 * place that reads a guest's net frame. Pure (no I/O, no allocation), so the fuzzer runs it as
 * is. The relay (net_relay.c) applies the stream rules (windows, ids, counts) on top. The guest's
 * end of the same wire is guest/src/net_wire_guest.c. */
#ifndef SBX_NET_WIRE_H
#define SBX_NET_WIRE_H

#include <stdint.h>

#include "frame.h"
#include "net_protocol.h"
#include "sbx_err.h"

struct sbx_net_frame {
	uint8_t type;      /* SBX_NET_MSG_OPEN, _CONNECTED, _REFUSED, _DATA, _CREDIT, _SHUTDOWN
			    * or _CLOSE */
	uint32_t stream;   /* never 0 (but REFUSED: always 0); OPEN: bit 31 clear; CONNECTED: set */
	uint32_t value;    /* OPEN: port; CONNECTED: status; CREDIT: bytes; CLOSE: close code;
			    * REFUSED: what (enum sbx_net_refusal) */
	uint32_t port;     /* REFUSED: the port (0 when it has none) */
	uint32_t count;    /* REFUSED: how many attempts it stands for */
	const uint8_t *data; /* OPEN: the name; DATA: the bytes; REFUSED: the subject (all point
			      * into the frame) */
	uint32_t len;
};

/* 0 and *out filled, or, with err saying what the guest got wrong: -EPROTO (a type the guest
 * may not send, a bad field, trailing bytes) or -EMSGSIZE (a name or DATA over its limit). */
int sbx_net_decode(const struct sbx_frame *f, struct sbx_net_frame *out, struct sbx_err *err);

/* 1 if name is a name the guest may send in OPEN: 1..SBX_NET_NAME_MAX bytes of lowercase ASCII
 * letters, digits, '-' and '.', not starting or ending with '.', no empty label. */
int sbx_net_name_ok(const uint8_t *name, uint32_t len);

/* 1 if text is an IPv4 address in dotted-quad form (four decimal numbers 0..255 without leading
 * zeros): at most SBX_NET_ADDRESS_TEXT_MAX bytes. */
int sbx_net_address_ok(const uint8_t *text, uint32_t len);

#endif /* SBX_NET_WIRE_H */
