/* Host requests: one handler per message type. */
#ifndef SBX_DISPATCH_H
#define SBX_DISPATCH_H

#include "agent_channel_guest.h"
#include "files.h"
#include "host_socket.h"
#include "net_relay_guest.h"
#include "procs.h"
#include "repl.h"
#include "runner.h"

struct sbx_agent {
	struct sbx_config cfg;
	struct sbx_channel ch;
	struct sbx_runner runner;
	struct sbx_repl repl;   /* session REPL (SESSION_EXEC) */
	struct sbx_files files; /* FILE_* transfers */
	struct sbx_net net;     /* the network, after NET_CONFIG (net_relay_guest.h) */
	struct sbx_host_socket hs; /* user code's calls and outputs (host_socket.h) */
	struct sbx_procs procs; /* background processes and terminals (procs.h) */
	int net_test_fd;        /* test mode: the net port's socket (--net-fd), else -1 */
	int signal_fd;
};

/* sbx_frame_fn for sbx_channel_handle; ctx is the struct sbx_agent. */
void sbx_dispatch_frame(void *ctx, const struct sbx_frame *f);

#endif /* SBX_DISPATCH_H */
