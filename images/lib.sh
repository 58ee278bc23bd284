# Shared helpers for the image build scripts (sourced, not executed).
# Every artefact lives under $EXEC_SANDBOX_IMAGES_DIR (default: the per-user cache dir), in a file
# or directory named by the SHA-256 of its inputs, so that a second build with the same inputs is a
# no-op and two versions can sit side by side.
set -euo pipefail

images_src_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${EXEC_SANDBOX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/exec-sandbox}
images_dir=${EXEC_SANDBOX_IMAGES_DIR:-$cache_root/images}
mkdir -p "$images_dir"

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

# run_logged LOG CMD...: run a long command, its output to LOG; on a terminal, show its last line
# every few seconds so that a build of minutes is not silent. On failure, print the log's tail.
run_logged() {
	local log=$1; shift
	"$@" >"$log" 2>&1 &
	local pid=$! rc=0
	if [ -t 2 ] && [ "${EXEC_SANDBOX_QUIET:-0}" != 1 ]; then
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
		rm -rf -- "$path" "$path.config" "$path.json"
	done < <(ls -1dt -- "$@" 2>/dev/null)
}
