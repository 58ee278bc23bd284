/* File transfer between host and the guest home (FILE_* messages of protocol.h), and of node's
 * startup snapshot (SBX_FILE_NODE_SNAPSHOT: the one file outside the home the host may write or
 * read, at cfg->node_snapshot, with the sandbox user's rights like the rest).
 *
 * Paths are resolved one component at a time from the home directory with O_NOFOLLOW, so that
 * neither a symlink nor ".." planted by user code can lead outside it; every file operation runs
 * with the sandbox user's filesystem credentials (setfsuid), so it can touch only what user code
 * could, and what it creates belongs to that user. Writes go to a temporary file in the target
 * directory that is renamed into place on commit: an aborted write leaves nothing behind.
 *
 * One write and one read may be in flight. A read is pumped by the event loop while the channel
 * has room (sbx_files_pump), so that a large file never sits whole in the agent's memory.
 */
#ifndef SBX_FILES_H
#define SBX_FILES_H

#include <stdbool.h>
#include <stdint.h>

#include "agent.h"
#include "agent_channel_guest.h"
#include "frame.h"

struct sbx_files {
	const struct sbx_config *cfg;
	struct sbx_channel *ch;
	/* write in progress */
	bool writing;
	bool write_failed; /* an error was reported: ignore DATA until END */
	uint32_t write_id;
	int write_dir_fd;
	int write_fd;
	uint32_t write_mode;
	uint64_t written;
	char tmp_name[64];
	char final_name[SBX_PATH_COMPONENT_MAX + 1];
	/* a write of node's startup snapshot: its CPU tag comes first, then the file */
	bool write_node_snapshot;
	uint32_t tag_len;
	uint8_t tag[SBX_NODE_TAG_SIZE];
	/* read in progress */
	int read_fd;
	uint32_t read_id;
	uint64_t read_sent;
	bool read_tag_first; /* node's startup snapshot: send this guest's CPU tag before it */
};

void sbx_files_init(struct sbx_files *f, const struct sbx_config *cfg, struct sbx_channel *ch);
/* Handle one FILE_* frame from the host. */
void sbx_files_handle(struct sbx_files *f, const struct sbx_frame *fr);
/* A read is waiting for channel room. */
bool sbx_files_pumping(const struct sbx_files *f);
/* Send a few chunks of the current read while the channel has room. */
void sbx_files_pump(struct sbx_files *f);
/* The host went away: drop transfers in progress (a partial write is removed). */
void sbx_files_abort(struct sbx_files *f);

#endif /* SBX_FILES_H */
