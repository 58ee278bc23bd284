#!/usr/bin/env bash
# Make the guest's Debian package tree (the recipe of rootfs-tree-<key>, part of its key with
# packages.txt, the suite and the mirror): mmdebstrap minbase + the package list, then trimmed and
# given the sandbox user. As root in mmdebstrap's root mode; otherwise unprivileged in a user
# namespace (--mode=unshare: needs the user's ranges in /etc/subuid and /etc/subgid), where the
# tree's files end up owned by the user's subordinate ids (images/lib.sh `in_tree_ns`).
# Usage: make-tree.sh ROOT SUITE MIRROR PACKAGES(comma-separated)
#        make-tree.sh --trim ROOT   (run by mmdebstrap inside its namespace)
set -euo pipefail

if [ "${1:-}" = --trim ]; then
	r=$2
	rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/usr/share/doc \
		"$r"/usr/share/man "$r"/usr/share/info "$r"/usr/share/locale "$r"/var/log/*
	# The sandbox user: uid/gid 1000, home on a tmpfs the agent mounts at boot.
	grep -q '^user:' "$r/etc/passwd" || echo 'user:x:1000:1000:sandbox user:/home/user:/bin/bash' >>"$r/etc/passwd"
	grep -q '^user:' "$r/etc/group" || echo 'user:x:1000:' >>"$r/etc/group"
	grep -q '^user:' "$r/etc/shadow" || echo 'user:!:19000::::::' >>"$r/etc/shadow"
	echo sandbox >"$r/etc/hostname"
	printf '127.0.0.1 localhost\n127.0.1.1 sandbox\n' >"$r/etc/hosts"
	mkdir -p "$r/home/user" "$r/run" "$r/tmp"
	exit 0
fi

root=$1 suite=$2 mirror=$3 packages=$4
mode=root
[ "$(id -u)" = 0 ] || mode=unshare
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
exec mmdebstrap --mode="$mode" --variant=minbase --include="$packages" \
	--customize-hook="bash '$self' --trim \"\$1\"" "$suite" "$root" "$mirror"
