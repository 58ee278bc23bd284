# Shared helpers for the image build scripts (sourced, not executed).
# Every artefact lives under $EXEC_SANDBOX_IMAGES_DIR (default: the per-user cache dir), in a file
# or directory named by the SHA-256 of its inputs, so that a second build with the same inputs is a
# no-op and two versions can sit side by side.
set -euo pipefail

images_src_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${EXEC_SANDBOX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/exec-sandbox}
images_dir=${EXEC_SANDBOX_IMAGES_DIR:-$cache_root/images}
mkdir -p "$images_dir"

# fail MESSAGE: stop the build with one line on stderr.
fail() {
	echo "$*" >&2
	exit 1
}

# as_root_hint: "sudo " when this user is not root (for the commands a message tells to run).
as_root_hint() {
	[ "$(id -u)" = 0 ] || printf 'sudo '
}


# step MESSAGE: one progress line on stderr (quiet when EXEC_SANDBOX_QUIET=1).
step() {
	[ "${EXEC_SANDBOX_QUIET:-0}" = 1 ] || printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

# inputs_hash FILE...: a short content hash over files (their names and bytes) and $HASH_EXTRA.
inputs_hash() {
	{
		for f in "$@"; do printf '%s\0' "$(basename "$f")"; cat "$f"; done
		printf '%s' "${HASH_EXTRA:-}"
	} | sha256sum | cut -c1-16
}

# run_logged LOG CMD...: run a long command, its output to LOG; show its last line every few
# seconds so that a build of minutes is not silent: on a terminal, or as `[images-detail] LINE`
# for `sbx setup` (EXEC_SANDBOX_PROGRESS=1), which draws it. On failure, print the log's tail.
run_logged() {
	local log=$1; shift
	"$@" >"$log" 2>&1 &
	local pid=$! rc=0
	if [ "${EXEC_SANDBOX_QUIET:-0}" = 1 ]; then
		:
	elif [ "${EXEC_SANDBOX_PROGRESS:-0}" = 1 ]; then
		while kill -0 "$pid" 2>/dev/null; do
			sleep 1
			printf '[images-detail] %s\n' "$(tail -n1 "$log" 2>/dev/null | cut -c1-100)" >&2
		done
	elif [ -t 2 ]; then
		while kill -0 "$pid" 2>/dev/null; do
			sleep 5
			printf '\r\033[K  ... %s' "$(tail -n1 "$log" 2>/dev/null | cut -c1-100)" >&2
		done
		printf '\r\033[K' >&2
	fi
	wait "$pid" || rc=$?
	if [ "$rc" != 0 ]; then
		echo "command failed ($rc): $*; last lines of $log:" >&2
		tail -n 40 "$log" >&2
	fi
	return "$rc"
}

# in_tree_ns CMD...: run CMD where the files of the guest's Debian tree have their right owners.
# As root, that is here. As another user, the tree was unpacked in a user namespace where this
# user is root and ids 1.. are the user's subordinate ids (/etc/subuid, /etc/subgid): seen from
# outside, its root-owned files are the user's and the others belong to subordinate ids, so CMD
# runs in the same kind of namespace (unshare through newuidmap/newgidmap).
in_tree_ns() {
	if [ "$(id -u)" = 0 ]; then "$@"; return; fi
	local user uid subuid subgid
	user=$(id -un) uid=$(id -u)
	subuid=$(awk -F: -v u="$user" -v i="$uid" '$1 == u || $1 == i { print $2 "," 1 "," $3; exit }' /etc/subuid)
	subgid=$(awk -F: -v u="$user" -v i="$uid" '$1 == u || $1 == i { print $2 "," 1 "," $3; exit }' /etc/subgid)
	[ -n "$subuid" ] && [ -n "$subgid" ] || fail "no subordinate ids for $user in /etc/subuid or /etc/subgid: sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $user"
	unshare --map-root-user --map-users="$subuid" --map-groups="$subgid" -- "$@"
}

# staging_dir KIND: make a private work directory in the images directory (same file system, so
# results are published by rename) and set $staging to it; removed when the script exits, and by
# the next build if this one is killed.
staging_dirs=()
staging_dir() {
	staging=$(mktemp -d "$images_dir/.staging-$1.XXXXXX")
	staging_dirs+=("$staging")
	trap _remove_staging EXIT
}
_remove_staging() {
	local d
	for d in "${staging_dirs[@]}"; do
		rm -rf -- "$d" 2>/dev/null || in_tree_ns rm -rf -- "$d" 2>/dev/null || true
	done
}

# debian_mirror SUITE: the Debian archive this host's apt is configured with (its sources, read
# now, so that a local or corporate mirror is used): the source of SUITE's main component if the
# host has one, else that of any Debian suite (an archive serves every suite).
# EXEC_SANDBOX_DEBIAN_MIRROR overrides it.
debian_mirror() {
	if [ -n "${EXEC_SANDBOX_DEBIAN_MIRROR:-}" ]; then echo "$EXEC_SANDBOX_DEBIAN_MIRROR"; return; fi
	local uri
	uri=$(apt-get indextargets --format '$(REPO_URI)' "Release: $1" 'Component: main' \
		'Target-Of: deb' 'Created-By: Packages' 2>/dev/null | head -n1)
	[ -n "$uri" ] || uri=$(apt-get indextargets --format '$(REPO_URI)' 'Label: Debian' \
		'Component: main' 'Target-Of: deb' 'Created-By: Packages' 2>/dev/null | head -n1)
	[ -n "$uri" ] || fail "this host's apt sources name no Debian archive (main component) to build the guest's $1 root file system from: add one (sources.list(5)) or set EXEC_SANDBOX_DEBIAN_MIRROR"
	echo "${uri%/}"
}

# reuse PATH: mark a cached artefact as just used (pruning keeps the most recently used).
reuse() {
	touch -c -- "$1"
}

# prune KEEP PATH...: of these cached artefacts of one kind, keep the KEEP most recently used and
# delete the others, but never one used in the last hour (another checkout's build sharing this
# cache may be about to write a manifest naming it). A running VM keeps its open files.
prune() {
	local keep=$1 n=0 path
	shift
	while IFS= read -r path; do
		n=$((n + 1))
		[ "$n" -le "$keep" ] && continue
		[ -n "$(find "$path" -maxdepth 0 -mmin +60)" ] || continue
		step "cache: removing $(basename "$path") (not used recently)"
		rm -rf -- "$path" "$path.config" "$path.json" 2>/dev/null || in_tree_ns rm -rf -- "$path" || true
	done < <(ls -1dt -- "$@" 2>/dev/null)
}

# One build at a time per images directory: a second `sbx setup` (or `make images`) waits for the
# first instead of compiling the same kernel beside it. Under the lock, any staging directory of
# ours is a leftover of a build that was killed: no image is published until it is complete (every
# artefact is renamed into place last), so a half build is never used and is removed here.
if [ -z "${EXEC_SANDBOX_IMAGES_LOCKED:-}" ]; then
	exec 9>>"$images_dir/.build.lock"
	if ! flock -n 9; then
		printf '[images] waiting for another build in %s to finish\n' "$images_dir" >&2
		flock 9
	fi
	export EXEC_SANDBOX_IMAGES_LOCKED=1
	for stale in "$images_dir"/.staging-*; do
		[ -e "$stale" ] || continue
		printf '[images] removing %s, left by an interrupted build\n' "$(basename "$stale")" >&2
		rm -rf -- "$stale" 2>/dev/null || in_tree_ns rm -rf -- "$stale" 2>/dev/null || true
	done
fi
