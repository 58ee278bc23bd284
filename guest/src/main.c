/* sbx-agent: PID 1 of the exec-sandbox guest. Boots the minimal userland (mounts, hostname,
 * loopback), opens the host channel and then serves requests from a single poll() loop forever.
 *
 * Test mode (--channel-fd N, or SBX_AGENT_TEST_CHANNEL_FD=N): runs as an ordinary host process on a
 * given fd (a socketpair end), with no mounts and no uid switch, user code under a private work
 * directory, and exits when the peer closes the channel. --net-fd M: the network port's stand-in
 * (a socketpair end too), used once NET_CONFIG arrives. Anything else must be PID 1: this program
 * would otherwise remount the host's /proc.
 *
 * Test mode with --boot: also the boot steps and the uid switch, as in the VM. Only as PID 1 of a
 * PID namespace, and meant for `unshare --pid --mount --uts --net --fork` plus a chroot: the mounts
 * would otherwise land on the host.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "agent_channel_guest.h"
#include "dispatch.h"
#include "net_trust.h"
#include "reaper.h"
#include "runner.h"
#include "sysctl.h"
#include "template.h"
#include "volumes.h"

#define CHANNEL_WAIT_MS 10000u

/* Boot cannot go on: in the VM stop it (QEMU's -no-reboot turns a reboot into an exit, which the
 * host notices at once, unlike a hang); in test mode just exit. */
__attribute__((noreturn)) static void fatal(const struct sbx_config *cfg, const char *what, int rc)
{
	sbx_log("fatal: %s: %s", what, strerror(-rc));
	if (cfg->test_mode)
		exit(1);
	sync();
	reboot(RB_AUTOBOOT);
	for (;;) /* reboot() does not return as PID 1; if it did, PID 1 still must not exit */
		pause();
}

static void usage(void)
{
	fprintf(stderr,
		"usage: sbx-agent                 (as PID 1 of the guest)\n"
		"       sbx-agent --channel-fd N [--work-dir DIR] [--interpreter LANG=PATH]...\n"
		"                 [--driver-dir DIR] [--net-fd M]\n"
		"                                 (test mode; LANG is python, javascript or raw)\n"
		"       sbx-agent --channel-fd N --boot [--interpreter LANG=PATH]...\n"
		"                                 (test mode as PID 1 of fresh namespaces)\n");
}

static int parse_fd(const char *s)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *s == '\0' || *end != '\0' || v < 0 || v > 65535)
		return -1;
	return (int)v;
}

static int set_interpreter(struct sbx_config *cfg, const char *spec)
{
	static const char *const names[] = {[SBX_LANG_PYTHON] = "python",
					    [SBX_LANG_JAVASCRIPT] = "javascript",
					    [SBX_LANG_RAW] = "raw"};
	const char *eq = strchr(spec, '=');
	if (!eq || eq[1] != '/')
		return -EINVAL;
	for (int lang = SBX_LANG_PYTHON; lang <= SBX_LANG_RAW; lang++) {
		if (strlen(names[lang]) == (size_t)(eq - spec) &&
		    strncmp(spec, names[lang], (size_t)(eq - spec)) == 0) {
			cfg->interpreter[lang] = eq + 1;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_args(struct sbx_config *cfg, int argc, char **argv, const char **work_dir)
{
	bool boot = false;
	const char *env_fd = getenv("SBX_AGENT_TEST_CHANNEL_FD");
	if (env_fd && *env_fd && (cfg->channel_fd = parse_fd(env_fd)) < 0)
		return -EINVAL;
	/* Every option takes one value. */
	for (int i = 1; i < argc; i += 2) {
		const char *arg = argv[i];
		const char *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(arg, "--channel-fd") == 0 && val) {
			if ((cfg->channel_fd = parse_fd(val)) < 0)
				return -EINVAL;
		} else if (strcmp(arg, "--boot") == 0) {
			boot = true;
			i--; /* takes no value */
		} else if (strcmp(arg, "--net-fd") == 0 && val) {
			if ((cfg->net_fd = parse_fd(val)) < 0)
				return -EINVAL;
		} else if (strcmp(arg, "--work-dir") == 0 && val) {
			*work_dir = val;
		} else if (strcmp(arg, "--driver-dir") == 0 && val) {
			if ((size_t)snprintf(cfg->driver_dir, sizeof(cfg->driver_dir), "%s", val) >=
			    sizeof(cfg->driver_dir))
				return -EINVAL;
		} else if (strcmp(arg, "--interpreter") == 0 && val) {
			if (set_interpreter(cfg, val) < 0)
				return -EINVAL;
		} else {
			return -EINVAL;
		}
	}
	cfg->test_mode = cfg->channel_fd >= 0;
	if (!cfg->test_mode || (boot && (getpid() != 1 || *work_dir)))
		return -EINVAL;
	cfg->boot = boot;
	return 0;
}

/* Test mode: code file and home under a private directory instead of /run/sbx and /home/user. */
static int setup_work_dir(struct sbx_config *cfg, const char *work_dir)
{
	char tmpl[] = "/tmp/sbx-agent.XXXXXX";
	if (!work_dir) {
		work_dir = mkdtemp(tmpl);
		if (!work_dir)
			return -errno;
	}
	if ((size_t)snprintf(cfg->run_dir, sizeof(cfg->run_dir), "%s/run", work_dir) >=
		    sizeof(cfg->run_dir) ||
	    (size_t)snprintf(cfg->home_dir, sizeof(cfg->home_dir), "%s/home", work_dir) >=
		    sizeof(cfg->home_dir) ||
	    (size_t)snprintf(cfg->node_snapshot, sizeof(cfg->node_snapshot), "%s/node-startup.blob",
			     work_dir) >= sizeof(cfg->node_snapshot))
		return -ENAMETOOLONG;
	if (mkdir(work_dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	if (mkdir(cfg->run_dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	if (mkdir(cfg->home_dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static void boot_steps(struct sbx_config *cfg)
{
	int rc;
	umask(022);
	/* Mount failures are logged inside and not fatal: a run that needs the missing piece fails
	 * visibly, which beats a VM that never answers. */
	sbx_mount_all();
	sbx_apply_sysctls();
	if ((rc = sbx_ensure_std_fds()) < 0)
		sbx_log("standard fds: %s", strerror(-rc));
	if ((rc = sbx_set_hostname("sandbox")) < 0)
		sbx_log("sethostname: %s", strerror(-rc));
	if ((rc = sbx_loopback_up()) < 0)
		sbx_log("loopback up: %s", strerror(-rc));
	sbx_net_boot_trust();
	snprintf(cfg->run_dir, sizeof(cfg->run_dir), "%s", SBX_RUN_DIR);
	snprintf(cfg->home_dir, sizeof(cfg->home_dir), "%s", SBX_HOME_DIR);
	snprintf(cfg->node_snapshot, sizeof(cfg->node_snapshot), "%s", SBX_NODE_SNAPSHOT);
	/* The modes only the VM has (template.h): a namespace test's command line is the host's. */
	if (cfg->test_mode)
		return;
	cfg->builder = sbx_builder_requested();
	if (cfg->builder) {
		sbx_log("builder mode");
		sbx_builder_setup();
	} else {
		/* Before the template: it binds the volumes into its root. */
		sbx_volumes_setup();
		sbx_template_setup(cfg);
	}
}

static void setup_signals(bool pid1)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_IGN;
	/* A write to a closed socket must come back as EPIPE, not kill the agent. */
	sigaction(SIGPIPE, &sa, NULL);
	if (pid1) {
		/* The kernel already shields init from signals it has no handler for; say it anyway. */
		static const int ignored[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2,
					      SIGTSTP, SIGTTIN, SIGTTOU};
		for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
			sigaction(ignored[i], &sa, NULL);
	}
}

static void on_child_exit(void *ctx, pid_t pid, int status)
{
	struct sbx_agent *a = ctx;
	sbx_runner_on_child_exit(&a->runner, pid, status);
	sbx_repl_on_child_exit(&a->repl, pid, status);
	sbx_procs_on_child_exit(&a->procs, pid, status);
}

static void shutdown_test_mode(struct sbx_agent *a)
{
	sbx_runner_abort(&a->runner);
	sbx_repl_abort(&a->repl);
	sbx_files_abort(&a->files);
	sbx_procs_abort(&a->procs);
	sbx_channel_free(&a->ch);
	exit(0);
}

/* The event loop: one poll() over the channel, the signalfd, the run's timer, pipes and report
 * socket, and the session REPL's. Never returns; errors are logged and the loop goes on. */
__attribute__((noreturn)) static void serve(struct sbx_agent *a)
{
	for (;;) {
		static struct pollfd p[11 + SBX_HOST_SOCKET_POLL_MAX + SBX_PROCS_POLL_MAX];
		int n = 0, timeout = -1;
		int ci = -1, oi = -1, ei = -1, di = -1, roi = -1, rei = -1, rci = -1, ni = -1;
		struct sbx_runner *r = &a->runner;
		struct sbx_repl *s = &a->repl;

		int cev = sbx_channel_poll_events(&a->ch, sbx_now_ns(), &timeout);
		/* A file read in progress goes on as soon as the channel has room. */
		if (sbx_files_pumping(&a->files) && sbx_channel_wants_output(&a->ch))
			timeout = 0;
		if (cev >= 0) {
			ci = n;
			p[n++] = (struct pollfd){.fd = a->ch.fd, .events = (short)cev};
		}
		int si = n;
		p[n++] = (struct pollfd){.fd = a->signal_fd, .events = POLLIN};
		int ti = n;
		p[n++] = (struct pollfd){.fd = r->timer_fd, .events = POLLIN};
		/* Back-pressure: while the host lags, leave output in the pipes (the writer blocks). */
		if (sbx_channel_wants_output(&a->ch)) {
			if (r->out.fd >= 0) {
				oi = n;
				p[n++] = (struct pollfd){.fd = r->out.fd, .events = POLLIN};
			}
			if (r->err.fd >= 0) {
				ei = n;
				p[n++] = (struct pollfd){.fd = r->err.fd, .events = POLLIN};
			}
			if (s->out.fd >= 0) {
				roi = n;
				p[n++] = (struct pollfd){.fd = s->out.fd, .events = POLLIN};
			}
			if (s->err.fd >= 0) {
				rei = n;
				p[n++] = (struct pollfd){.fd = s->err.fd, .events = POLLIN};
			}
		}
		/* Only while the host takes output: the report is followed by the final drain. */
		if (r->done_fd >= 0 && sbx_channel_wants_output(&a->ch)) {
			di = n;
			p[n++] = (struct pollfd){.fd = r->done_fd, .events = POLLIN};
		}
		int sti = n;
		p[n++] = (struct pollfd){.fd = s->timer_fd, .events = POLLIN};
		if (s->control_r >= 0) {
			rci = n;
			p[n++] = (struct pollfd){.fd = s->control_r, .events = POLLIN};
		}

		if (sbx_net_poll_fd(&a->net) >= 0) {
			ni = n;
			p[n++] = (struct pollfd){.fd = sbx_net_poll_fd(&a->net), .events = POLLIN};
		}
		int hi = n;
		int hn = sbx_host_socket_poll(&a->hs, p + n);
		n += hn;
		int pi = n;
		int pn = sbx_procs_poll(&a->procs, p + n, &timeout);
		n += pn;

		if (poll(p, (nfds_t)n, timeout) < 0) {
			if (errno != EINTR) {
				sbx_log("poll: %s", strerror(errno));
				struct timespec ts = {0, 10 * 1000 * 1000}; /* never spin */
				nanosleep(&ts, NULL);
			}
			continue;
		}

		/* Order matters: reap first (a child's death starts the drain), then output, then
		 * the timer, and the channel last, since a new EXEC may reuse the pipe fd numbers. */
		if (p[si].revents) {
			bool sigio = false;
			sbx_reaper_handle(a->signal_fd, on_child_exit, a, &sigio);
			if (sigio)
				sbx_channel_wake(&a->ch);
		}
		if (oi >= 0 && p[oi].revents && r->out.fd == p[oi].fd)
			sbx_runner_on_output(r, &r->out);
		if (ei >= 0 && p[ei].revents && r->err.fd == p[ei].fd)
			sbx_runner_on_output(r, &r->err);
		if (di >= 0 && p[di].revents && r->done_fd == p[di].fd)
			sbx_runner_on_done(r);
		if (p[ti].revents)
			sbx_runner_on_timer(r);
		/* Session REPL: output before the completion report, so that the report's drain
		 * finds only what is left. */
		if (roi >= 0 && p[roi].revents && s->out.fd == p[roi].fd)
			sbx_repl_on_output(s, &s->out);
		if (rei >= 0 && p[rei].revents && s->err.fd == p[rei].fd)
			sbx_repl_on_output(s, &s->err);
		if (rci >= 0 && p[rci].revents && s->control_r == p[rci].fd)
			sbx_repl_on_control(s);
		if (p[sti].revents)
			sbx_repl_on_timer(s);
		sbx_files_pump(&a->files);
		if (ni >= 0 && p[ni].revents)
			sbx_net_handle(&a->net);
		/* After the runs' events, so that a call finds the execution that is running now. */
		sbx_host_socket_handle(&a->hs, p + hi, hn);
		/* Background processes: after the reaper (an exit answers a held PROC_WAIT), before
		 * the channel (new requests see this turn's output). */
		sbx_procs_handle_poll(&a->procs, p + pi, pn);
		if (ci >= 0) {
			switch (sbx_channel_handle(&a->ch, p[ci].revents, sbx_dispatch_frame, a)) {
			case SBX_CHAN_HANGUP:
				shutdown_test_mode(a);
				break;
			case SBX_CHAN_CONNECTED:
			case SBX_CHAN_DISCONNECTED:
				/* Whoever asked for a running execution is gone. */
				sbx_runner_abort(r);
				sbx_repl_abort(s);
				sbx_files_abort(&a->files);
				/* Processes go on: they belong to the VM, not to a connection. */
				sbx_procs_drop_held(&a->procs);
				break;
			default:
				break;
			}
		}
	}
}

int main(int argc, char **argv)
{
	static struct sbx_agent agent;
	struct sbx_config *cfg = &agent.cfg;
	const char *work_dir = NULL;
	int rc;

	cfg->channel_fd = -1;
	cfg->net_fd = -1;
	cfg->interpreter[SBX_LANG_PYTHON] = "/usr/bin/python3";
	cfg->interpreter[SBX_LANG_JAVASCRIPT] = SBX_NODE_BINARY;
	cfg->interpreter[SBX_LANG_RAW] = "/bin/bash";
	/* As the VM's PID 1, argv and the environment hold whatever kernel parameters the kernel did
	 * not recognise: ignore them, unless this is a namespace test (first argument --channel-fd).
	 * Not as PID 1, only test mode is allowed. */
	bool pid1 = getpid() == 1;
	if (!pid1 || (argc > 1 && strcmp(argv[1], "--channel-fd") == 0)) {
		if (parse_args(cfg, argc, argv, &work_dir) < 0) {
			usage();
			return 2;
		}
	}
	cfg->boot = cfg->boot || !cfg->test_mode;
	cfg->drop_privileges = cfg->boot && geteuid() == 0;
	setup_signals(pid1);

	if (cfg->boot) {
		boot_steps(cfg);
		/* The builder's steps are root's: its VM is the sandbox. */
		if (cfg->builder)
			cfg->drop_privileges = false;
	} else {
		if ((rc = setup_work_dir(cfg, work_dir)) < 0)
			fatal(cfg, "work directory", rc);
		/* Stand-in for PID 1: orphans of user code are reparented to the agent. */
		prctl(PR_SET_CHILD_SUBREAPER, 1);
	}

	/* Before any fork, so that no SIGCHLD goes unnoticed. */
	agent.signal_fd = rc = sbx_reaper_init();
	if (rc < 0)
		fatal(cfg, "signalfd", rc);

	int fd = cfg->channel_fd;
	if (!cfg->test_mode) {
		rc = sbx_channel_find_port(SBX_CHANNEL_PORT_NAME, CHANNEL_WAIT_MS, &fd);
		if (rc < 0)
			fatal(cfg, "virtio-serial port " SBX_CHANNEL_PORT_NAME, rc);
	}
	if ((rc = sbx_channel_init(&agent.ch, fd, cfg->test_mode, !cfg->test_mode)) < 0)
		fatal(cfg, "channel", rc);
	if ((rc = sbx_runner_init(&agent.runner, cfg, &agent.ch)) < 0)
		fatal(cfg, "timerfd", rc);
	if ((rc = sbx_repl_init(&agent.repl, cfg, &agent.ch)) < 0)
		fatal(cfg, "timerfd", rc);
	sbx_files_init(&agent.files, cfg, &agent.ch);
	sbx_net_init(&agent.net);
	sbx_host_socket_init(&agent.hs, cfg, &agent.ch, &agent.runner, &agent.repl);
	sbx_procs_init(&agent.procs, cfg, &agent.ch);
	agent.net_test_fd = cfg->net_fd;

	static const char ready[] = "sbx-agent: ready\n";
	ssize_t w = write(STDOUT_FILENO, ready, sizeof(ready) - 1);
	(void)w;
	serve(&agent);
}
