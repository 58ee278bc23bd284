#!/usr/bin/env bash
# Build everything a VM boots from, reusing the content-hashed cache: the guest agent, the
# kernel and the root image; then write manifest.json, which the Python library reads to find
# them. This is the one recipe: `sbx setup` runs the copy of these scripts installed with the
# package (exec_sandbox/_recipe/, laid out like this repository), `make images` runs `sbx setup`.
# Usage: images/build.sh (from anywhere). Progress goes to stderr.
source "$(dirname "$0")/lib.sh"
recipe_root=$(cd "$images_src_dir/.." && pwd)

# The agent, built from guest/ and src/shared/ into agent-<hash of its sources and compiler>/.
# The source directory is mapped away in the debug info, so that the binary (whose hash is part
# of the root image's key) is the same whether built from a checkout or an installed package.
HASH_EXTRA="$(gcc --version | head -n1) $(dpkg-query -W -f='${Version}' libc6-dev 2>/dev/null || true)"
agent_key=$(inputs_hash "$recipe_root/guest/Makefile" "$recipe_root"/guest/src/*.[ch] "$recipe_root"/guest/node/*.c "$recipe_root"/src/shared/*.[ch] "$recipe_root/src/shared/warnings.mk")
agent="$images_dir/agent-$agent_key/sbx-agent"
if [ -x "$agent" ] && [ -f "$(dirname "$agent")/sbx-reseed.node" ]; then
	step "guest agent $agent_key: cached"; reuse "$(dirname "$agent")"
else
	step "guest agent $agent_key: compiling"
	staging_dir agent
	run_logged "$staging/make.log" make -s -C "$recipe_root/guest" BUILD="$staging/build" \
		CFLAGS="-ffile-prefix-map=$recipe_root/=" VERSION=0.1.0
	install -D -m 0755 "$staging/build/sbx-agent" "$staging/out/sbx-agent"
	install -m 0644 "$staging/build/sbx-reseed.node" "$staging/out/sbx-reseed.node"
	mv "$staging/out" "$(dirname "$agent")"
fi
kernel=$(bash "$images_src_dir/build-kernel.sh")
rootfs=$(bash "$images_src_dir/build-rootfs.sh" "$agent")

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
prune 4 "$images_dir"/agent-????????????????
step "images ready: $manifest"
