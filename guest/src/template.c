/* Template and builder modes: see template.h. */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cleanup.h"
#include "volumes.h"
#include "workspace.h"

#define NOSUID_NODEV (MS_NOSUID | MS_NODEV)
#define TEMPLATE_IMAGE SBX_TEMPLATE_DIR "/image"
#define TEMPLATE_RW SBX_TEMPLATE_DIR "/rw"
#define TEMPLATE_ROOT SBX_TEMPLATE_DIR "/root"

static int mkdir_one(const char *path, mode_t mode)
{
	if (mkdir(path, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* --- builder mode ------------------------------------------------------------------------------ */

bool sbx_builder_requested(void)
{
	char buf[4096];
	int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	/* A whole word: "xsbx.builder=1" or "sbx.builder=10" is not it. */
	for (char *tok = strtok(buf, " \t\n"); tok; tok = strtok(NULL, " \t\n"))
		if (strcmp(tok, "sbx.builder=1") == 0)
			return true;
	return false;
}

void sbx_builder_setup(void)
{
	static const char *const kinds[] = {"source", "base"};
	if (mkdir_one(SBX_BUILD_DIR, 0755) < 0)
		sbx_log("mkdir %s: %s", SBX_BUILD_DIR, strerror(errno));
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		char dev[64], target[64];
		snprintf(target, sizeof(target), SBX_BUILD_DIR "/%s", kinds[i]);
		if (sbx_find_disk(kinds[i], dev, sizeof(dev)) < 0)
			continue; /* base is there only for a template built on another */
		if (mkdir_one(target, 0755) < 0 ||
		    mount(dev, target, "erofs", MS_RDONLY | NOSUID_NODEV, NULL) < 0)
			sbx_log("builder: mount %s on %s: %s", dev, target, strerror(errno));
	}
}

/* --- template mode: mounts inside the template's root ------------------------------------------ */

static void fail(struct sbx_template *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct sbx_template *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(t->error, sizeof(t->error), fmt, ap);
	va_end(ap);
	(void)n;
	sbx_log("template: %s", t->error);
}

static int resolve_in_root(int root_fd, const char *path, int flags, uint64_t resolve)
{
	struct open_how how = {
		.flags = (uint64_t)(unsigned)(flags | O_CLOEXEC),
		.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | resolve,
	};
	int fd = (int)syscall(SYS_openat2, root_fd, path, &how, sizeof(how));
	return fd < 0 ? -errno : fd;
}

static int open_in_root(int root_fd, const char *path, int flags)
{
	return resolve_in_root(root_fd, path, flags, 0);
}

/* Where a mount point is made: on the template's own overlay only. An image symlink leading
 * into a bind made earlier (the agent's /dev, /run/sbx, the home) must not have the agent
 * create or replace entries there. */
static int open_on_overlay(int root_fd, const char *path, int flags)
{
	return resolve_in_root(root_fd, path, flags, RESOLVE_NO_XDEV);
}

/* The directory path (relative, "a/b/c") inside the root, made where missing: each prefix is
 * resolved inside the root (an image's symlinks may lead anywhere in it, never out), and a
 * missing last component made in the directory its prefix resolved to. An O_PATH fd or -errno. */
static int dir_in_root(int root_fd, const char *path)
{
	char prefix[128];
	size_t len = strlen(path);
	if (len >= sizeof(prefix))
		return -ENAMETOOLONG;
	int parent = fcntl(root_fd, F_DUPFD_CLOEXEC, 3);
	if (parent < 0)
		return -errno;
	for (size_t i = 0; i <= len; i++) {
		if (path[i] != '/' && path[i] != '\0')
			continue;
		memcpy(prefix, path, i);
		prefix[i] = '\0';
		int fd = open_on_overlay(root_fd, prefix, O_PATH | O_DIRECTORY);
		if (fd == -ENOENT) {
			const char *name = strrchr(prefix, '/');
			name = name ? name + 1 : prefix;
			if (mkdirat(parent, name, 0755) < 0 && errno != EEXIST) {
				int e = errno;
				close(parent);
				return -e;
			}
			fd = open_on_overlay(root_fd, prefix, O_PATH | O_DIRECTORY);
		}
		close(parent);
		if (fd < 0)
			return fd;
		parent = fd;
	}
	return parent;
}

/* A regular file at dir/name inside the root to bind a file over: whatever else is there (a
 * symlink such as resolv.conf -> ../run/..., which would lead the bind elsewhere) is replaced by
 * an empty file. An O_PATH fd or -errno. */
static int file_in_root(int root_fd, const char *dir, const char *name)
{
	_cleanup_close_ int dfd = dir_in_root(root_fd, dir);
	if (dfd < 0)
		return dfd;
	/* dfd is O_PATH: the *at calls below need a real directory fd. */
	_cleanup_close_ int d = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (d < 0)
		return -errno;
	struct stat st;
	if (fstatat(d, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) &&
	    unlinkat(d, name, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0)
		return -errno;
	int fd = openat(d, name, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	close(fd);
	fd = openat(d, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* mount() onto what fd refers to: through /proc/self/fd, which names that very inode, never a
 * path an image symlink could redirect. */
static int mount_on(int fd, const char *source, const char *fstype, unsigned long flags,
		    const char *data)
{
	char target[40];
	snprintf(target, sizeof(target), "/proc/self/fd/%d", fd);
	if (mount(source, target, fstype, flags, data) < 0)
		return -errno;
	return 0;
}

struct root_mount {
	const char *path;   /* inside the root, relative */
	const char *source; /* the agent's path for binds */
	const char *fstype; /* NULL: a bind */
	unsigned long flags;
	const char *data;
	bool file;
	bool read_only; /* a bind remounted read-only */
	bool optional;  /* the agent may lack the source */
};

/* Order matters: /dev's submounts come with it (rbind), /run/sbx's do not (the template's own
 * mounts live under it). */
static const struct root_mount root_mounts[] = {
	{"proc", "proc", "proc", NOSUID_NODEV | MS_NOEXEC, "hidepid=2", false, false, false},
	{"dev", "/dev", NULL, MS_BIND | MS_REC, NULL, false, false, false},
	/* The agent's /tmp: on the work disk when the VM has one (mounts.c mounts it first). */
	{"tmp", "/tmp", NULL, MS_BIND, NULL, false, false, false},
	{"home/user", SBX_HOME_DIR, NULL, MS_BIND, NULL, false, false, false},
	{"usr/lib/sbx", SBX_LIB_DIR, NULL, MS_BIND, NULL, false, true, false},
	{"run/sbx", SBX_RUN_DIR, NULL, MS_BIND, NULL, false, false, false},
	{"etc/resolv.conf", "/etc/resolv.conf", NULL, MS_BIND, NULL, true, true, true},
	{"etc/hosts", "/etc/hosts", NULL, MS_BIND, NULL, true, true, true},
};

static int mount_in_root(int root_fd, const struct root_mount *m)
{
	struct stat st;
	if (m->optional && !m->fstype && stat(m->source, &st) < 0)
		return 0;
	int fd;
	if (m->file) {
		const char *slash = strrchr(m->path, '/');
		char dir[64];
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - m->path), m->path);
		fd = file_in_root(root_fd, dir, slash + 1);
	} else {
		fd = dir_in_root(root_fd, m->path);
	}
	if (fd < 0)
		return fd;
	int rc = mount_on(fd, m->source, m->fstype, m->flags, m->data);
	if (rc == 0 && m->read_only) {
		/* A bind takes the read-only flag only from a remount of itself. */
		close(fd);
		fd = m->file ? open_in_root(root_fd, m->path, O_PATH)
			     : open_in_root(root_fd, m->path, O_PATH | O_DIRECTORY);
		rc = fd < 0 ? fd
			    : mount_on(fd, NULL, NULL,
				       MS_BIND | MS_REMOUNT | MS_RDONLY | NOSUID_NODEV, NULL);
	}
	if (fd >= 0)
		close(fd);
	return rc;
}

/* Volume i (volumes.h) at its path inside the root, read-only if it is. Its mount point is
 * made on the template's overlay; under a bind of the agent's (/home/user), where the agent
 * already made it, it is looked up across that mount instead. */
static int bind_volume(int root_fd, size_t i)
{
	const struct sbx_volume_arg *v = sbx_volume_at(i);
	char source[64];
	int rc = sbx_volume_source(i, source, sizeof(source));
	if (rc < 0)
		return rc;
	const char *rel = v->path + 1;
	int fd = dir_in_root(root_fd, rel);
	/* Only a path in the home crosses one of the agent's binds on purpose (the home is one):
	 * anywhere else, a crossing means the template's own links lead into another bind (e.g.
	 * /run/sbx), which a volume must not cover. */
	if (fd == -EXDEV && strncmp(v->path, SBX_HOME_DIR "/", strlen(SBX_HOME_DIR "/")) == 0)
		fd = open_in_root(root_fd, rel, O_PATH | O_DIRECTORY);
	if (fd < 0)
		return fd;
	rc = mount_on(fd, source, NULL, MS_BIND, NULL);
	close(fd);
	if (rc < 0 || !v->read_only)
		return rc;
	fd = open_in_root(root_fd, rel, O_PATH | O_DIRECTORY);
	if (fd < 0)
		return fd;
	rc = mount_on(fd, NULL, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | NOSUID_NODEV, NULL);
	close(fd);
	return rc;
}

/* A small file of the image's sbx/ directory, at most max bytes (more: -EFBIG). The length or
 * -errno; *out malloc'd (NUL-terminated). */
static long read_image_file(const char *name, size_t max, char **out)
{
	char path[96];
	snprintf(path, sizeof(path), TEMPLATE_IMAGE "/sbx/%s", name);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	if ((uint64_t)st.st_size > max)
		return -EFBIG;
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		return -ENOMEM;
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* an erofs file does not shrink; take what there is */
		got += (size_t)n;
	}
	buf[got] = '\0';
	*out = buf;
	return (long)got;
}

static void warn_env_line(void *ctx, size_t line, const char *why)
{
	(void)ctx;
	sbx_log("template: sbx/env line %zu skipped: %s", line, why);
}

static void read_env_and_workdir(struct sbx_template *t)
{
	char *buf = NULL;
	long n = read_image_file("env", SBX_TEMPLATE_ENV_FILE_MAX, &buf);
	if (n >= 0) {
		if (sbx_template_parse_env(buf, (size_t)n, t->env, &t->env_count, warn_env_line,
					   NULL) < 0)
			sbx_log("template: sbx/env: out of memory");
	} else if (n != -ENOENT) {
		sbx_log("template: sbx/env ignored: %s", strerror((int)-n));
	}
	free(buf);
	buf = NULL;
	n = read_image_file("workdir", SBX_TEMPLATE_WORKDIR_MAX + 1, &buf);
	if (n >= 0 && sbx_template_parse_workdir(buf, (size_t)n, t->workdir, sizeof(t->workdir)) < 0)
		sbx_log("template: sbx/workdir is not an absolute path: " SBX_TEMPLATE_WORKDIR_DEFAULT);
	if (n < 0) {
		snprintf(t->workdir, sizeof(t->workdir), "%s", SBX_TEMPLATE_WORKDIR_DEFAULT);
		if (n != -ENOENT)
			sbx_log("template: sbx/workdir ignored: %s", strerror((int)-n));
	}
	free(buf);
}

static void find_interpreters(struct sbx_config *cfg, int root_fd)
{
	struct sbx_template *t = &cfg->tpl;
	for (uint8_t lang = SBX_LANG_PYTHON; lang <= SBX_LANG_RAW; lang++) {
		bool is_bash = false;
		int rc = sbx_template_find_interpreter(root_fd, lang, t->interpreter[lang],
						       sizeof(t->interpreter[lang]), &is_bash);
		cfg->interpreter[lang] = rc == 0 ? t->interpreter[lang] : NULL;
		if (lang == SBX_LANG_RAW)
			t->raw_is_bash = is_bash;
	}
}

void sbx_template_setup(struct sbx_config *cfg)
{
	struct sbx_template *t = &cfg->tpl;
	char dev[64];
	if (sbx_find_disk("template", dev, sizeof(dev)) < 0)
		return;
	t->active = true;
	snprintf(t->root, sizeof(t->root), "%s", TEMPLATE_ROOT);
	/* Root's alone: nothing of the image or its writes is reached but through the chroot. */
	if (mkdir_one(SBX_TEMPLATE_DIR, 0700) < 0 || mkdir_one(TEMPLATE_IMAGE, 0755) < 0 ||
	    mkdir_one(TEMPLATE_RW, 0755) < 0 || mkdir_one(TEMPLATE_ROOT, 0755) < 0) {
		fail(t, "mkdir under " SBX_TEMPLATE_DIR ": %s", strerror(errno));
		return;
	}
	if (mount(dev, TEMPLATE_IMAGE, "erofs", MS_RDONLY | NOSUID_NODEV, NULL) < 0) {
		fail(t, "mounting the template image %s: %s", dev, strerror(errno));
		return;
	}
	/* The writes of user code (as root could, of the tree's own owners) go to the work disk
	 * when there is one (workspace.h; a directory user code cannot reach outside the root),
	 * else to RAM: a share of it, as the agent's /tmp, so that a full one is ENOSPC. */
	if ((sbx_workspace_active()
		 ? (mkdir_one(SBX_WORK_DIR "/template", 0700) < 0 ||
		    mount(SBX_WORK_DIR "/template", TEMPLATE_RW, NULL, MS_BIND, NULL) < 0)
		 : mount("tmpfs", TEMPLATE_RW, "tmpfs", NOSUID_NODEV, "mode=0755,size=25%") < 0) ||
	    mkdir_one(TEMPLATE_RW "/upper", 0755) < 0 || mkdir_one(TEMPLATE_RW "/work", 0755) < 0) {
		fail(t, "the template's writable layer: %s", strerror(errno));
		return;
	}
	if (mount("overlay", TEMPLATE_ROOT, "overlay", NOSUID_NODEV,
		  "lowerdir=" TEMPLATE_IMAGE "/root,upperdir=" TEMPLATE_RW "/upper,workdir=" TEMPLATE_RW
		  "/work") < 0) {
		fail(t, "the template's overlay root: %s", strerror(errno));
		return;
	}
	_cleanup_close_ int root_fd = open(TEMPLATE_ROOT, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0) {
		fail(t, "opening %s: %s", TEMPLATE_ROOT, strerror(errno));
		return;
	}
	/* Before the binds: an interpreter is the image's own, never one of /usr/lib/sbx. */
	find_interpreters(cfg, root_fd);
	for (size_t i = 0; i < sizeof(root_mounts) / sizeof(root_mounts[0]); i++) {
		int rc = mount_in_root(root_fd, &root_mounts[i]);
		if (rc < 0) {
			fail(t, "mounting /%s in the template: %s", root_mounts[i].path, strerror(-rc));
			return;
		}
	}
	for (size_t i = 0; i < sbx_volumes_count(); i++) {
		int rc = bind_volume(root_fd, i);
		if (rc < 0) {
			fail(t, "mounting volume %s in the template: %s", sbx_volume_at(i)->path,
			     strerror(-rc));
			return;
		}
	}
	/* Node's reseed addon is built for the default image's node: another node must not load
	 * it. An empty file over it fails its dlopen, which the preload takes as "no addon": that
	 * node then reports it cannot refresh its generators, and a RESEED discards it. */
	char addon[96];
	snprintf(addon, sizeof(addon), "usr/lib/sbx/sbx-reseed.node");
	int afd = open_in_root(root_fd, addon, O_PATH);
	if (afd >= 0) {
		int rc = mount_on(afd, "/dev/null", NULL, MS_BIND, NULL);
		close(afd);
		if (rc < 0) {
			fail(t, "hiding node's reseed addon: %s", strerror(-rc));
			return;
		}
	}
	read_env_and_workdir(t);
	sbx_log("template: mounted %s (python3 %s, node %s, raw %s; %zu variables, workdir %s)", dev,
		t->interpreter[SBX_LANG_PYTHON][0] ? t->interpreter[SBX_LANG_PYTHON] : "absent",
		t->interpreter[SBX_LANG_JAVASCRIPT][0] ? t->interpreter[SBX_LANG_JAVASCRIPT]
						       : "absent",
		t->interpreter[SBX_LANG_RAW][0] ? t->interpreter[SBX_LANG_RAW] : "absent",
		t->env_count, t->workdir);
}

bool sbx_mode_allows(const struct sbx_config *cfg, uint8_t language, bool session_or_prestart,
		     uint32_t *code, char *msg, size_t msg_size)
{
	const struct sbx_template *t = &cfg->tpl;
	if (cfg->builder) {
		if (language == SBX_LANG_RAW && !session_or_prestart)
			return true;
		*code = SBX_ERR_BAD_REQUEST;
		snprintf(msg, msg_size, "a template builder runs one-shot raw code only");
		return false;
	}
	const char *volumes = sbx_volumes_error();
	if (volumes) {
		*code = SBX_ERR_SPAWN;
		snprintf(msg, msg_size, "the volumes could not be set up: %s", volumes);
		return false;
	}
	if (!t->active)
		return true;
	if (t->error[0]) {
		*code = SBX_ERR_SPAWN;
		snprintf(msg, msg_size, "the template could not be set up: %s", t->error);
		return false;
	}
	if (!cfg->interpreter[language]) {
		*code = SBX_ERR_SPAWN;
		snprintf(msg, msg_size, "this template has no %s",
			 sbx_template_interpreter_name(language));
		return false;
	}
	if (language == SBX_LANG_RAW && session_or_prestart && !t->raw_is_bash) {
		*code = SBX_ERR_SPAWN;
		snprintf(msg, msg_size, "this template has no bash (a session or a pre-started shell "
					"needs it; it has %s)",
			 cfg->interpreter[language]);
		return false;
	}
	return true;
}
