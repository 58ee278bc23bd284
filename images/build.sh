#!/usr/bin/env bash
# Build everything a VM boots from, reusing the content-hashed cache: the guest agent, the
# kernel and the root image; then write manifest.json, which the Python library reads to find
# them. Usage: images/build.sh (from anywhere). Progress goes to stderr.
source "$(dirname "$0")/lib.sh"
repo_root=$(cd "$images_src_dir/.." && pwd)

step "guest agent: make -C guest"
make -s -C "$repo_root/guest" >&2
agent="$repo_root/guest/build/sbx-agent"
kernel=$("$images_src_dir/build-kernel.sh")
rootfs=$("$images_src_dir/build-rootfs.sh" "$agent")

kernel_hash=$(basename "$kernel" | sed 's/^vmlinux-//')
rootfs_hash=$(basename "$rootfs" .erofs | sed 's/^rootfs-//')
manifest="$images_dir/manifest.json"
cat >"$manifest.tmp" <<JSON
{
  "kernel": "$kernel",
  "kernel_hash": "$kernel_hash",
  "rootfs": "$rootfs",
  "rootfs_hash": "$rootfs_hash",
  "guest": $(cat "$rootfs.json")
}
JSON
mv "$manifest.tmp" "$manifest"
# Every change of the agent makes a new ~300 MB root image: keep the cache from growing without end.
prune 3 "$images_dir"/vmlinux-????????????????
prune 4 "$images_dir"/rootfs-????????????????.erofs
prune 2 "$images_dir"/rootfs-tree-????????????????
step "images ready: $manifest"
