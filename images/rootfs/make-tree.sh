#!/usr/bin/env bash
# Make the guest's Debian package tree (the recipe of rootfs-tree-<key>, part of its key with
# packages.txt, the suite and the mirror): mmdebstrap minbase + the package list, trimmed and given
# the sandbox user, streamed as a tar and unpacked into ROOT. As root in mmdebstrap's root mode;
# otherwise unprivileged (--mode=unshare: needs newuidmap and the user's ranges in /etc/subuid
# and /etc/subgid), and unpacked in a user namespace where this user is root and the other ids
# are the user's subordinate ids (images/lib.sh in_tree_ns), so the tree keeps its owners.
# Device nodes are left out: the guest's /dev is a devtmpfs.
# Usage: make-tree.sh ROOT SUITE MIRROR PACKAGES(comma-separated)
source "$(dirname "$0")/../lib.sh"

root=$1 suite=$2 mirror=$3 packages=$4
# Run by mmdebstrap's sh with the tree as $1, as that namespace's root (which cannot read this
# user's files, hence inline).
trim='set -e
r=$1
rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/usr/share/doc \
	"$r"/usr/share/man "$r"/usr/share/info "$r"/usr/share/locale "$r"/var/log/*
# The sandbox user: uid/gid 1000, home on a tmpfs the agent mounts at boot.
grep -q "^user:" "$r/etc/passwd" || echo "user:x:1000:1000:sandbox user:/home/user:/bin/bash" >>"$r/etc/passwd"
grep -q "^user:" "$r/etc/group" || echo "user:x:1000:" >>"$r/etc/group"
grep -q "^user:" "$r/etc/shadow" || echo "user:!:19000::::::" >>"$r/etc/shadow"
echo sandbox >"$r/etc/hostname"
printf "127.0.0.1 localhost\n127.0.1.1 sandbox\n" >"$r/etc/hosts"
mkdir -p "$r/home/user" "$r/run" "$r/tmp"'
mode=root
[ "$(id -u)" = 0 ] || mode=unshare
mkdir "$root"
mmdebstrap --mode="$mode" --variant=minbase --include="$packages" --customize-hook="$trim" \
	"$suite" - "$mirror" | in_tree_ns tar --numeric-owner -xpf - -C "$root" --exclude='./dev/?*'
