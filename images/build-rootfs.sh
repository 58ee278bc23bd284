#!/usr/bin/env bash
# Build the guest root file system: a Debian bookworm tree from Debian's packages (debootstrap
# minbase + rootfs/packages.txt), trimmed, with the guest agent installed as /usr/sbin/sbx-agent,
# packed as a read-only EROFS image. Two cache levels, both keyed by content hash:
#   rootfs-tree-<H1>/      the unpacked package tree (H1: package list, this script, mirror)
#   rootfs-<H2>.erofs      the image (H2: H1 + the agent binary + the session REPL drivers +
#                          rootfs/finish-image.sh), with rootfs-<H2>.erofs.json beside it: the
#                          facts the host needs about the image (python version, glibc)
# so that rebuilding the agent only re-runs mkfs.erofs. Usage: build-rootfs.sh AGENT_BINARY.
# Prints the image path.
source "$(dirname "$0")/lib.sh"

agent=${1:?usage: build-rootfs.sh path/to/sbx-agent}
[ -x "$agent" ] || { echo "agent binary $agent missing: make -C guest" >&2; exit 1; }
mirror=${EXEC_SANDBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
packages=$(grep -v '^\s*#' "$images_src_dir/rootfs/packages.txt" | grep -v '^\s*$' | paste -sd, -)

HASH_EXTRA="$mirror $suite"
tree_key=$(inputs_hash "$images_src_dir/rootfs/packages.txt" "$0")
tree="$images_dir/rootfs-tree-$tree_key"
HASH_EXTRA="$tree_key"
# The session REPL drivers (guest/repl/) go to /usr/lib/sbx beside the agent.
drivers=("$images_src_dir"/../guest/repl/driver.py "$images_src_dir"/../guest/repl/driver.js "$images_src_dir"/../guest/repl/driver.sh)
finish="$images_src_dir/rootfs/finish-image.sh"
image_key=$(inputs_hash "$agent" "${drivers[@]}" "$finish")
image="$images_dir/rootfs-$image_key.erofs"
reuse "$tree"
if [ -f "$image" ] && [ -f "$image.json" ]; then
	step "rootfs $image_key: cached"; reuse "$image"; echo "$image"; exit 0
fi

if [ ! -d "$tree" ]; then
	staging=$(mktemp -d "$images_dir/.rootfs-tree.XXXXXX")
	trap 'rm -rf "$staging"' EXIT
	step "rootfs: debootstrap $suite minbase + $(echo "$packages" | tr , '\n' | wc -l) packages (a few minutes)"
	run_logged "$staging.log" debootstrap --variant=minbase --include="$packages" "$suite" "$staging/root" "$mirror"
	step "rootfs: trimming"
	r="$staging/root"
	rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/usr/share/doc \
		"$r"/usr/share/man "$r"/usr/share/info "$r"/usr/share/locale "$r"/var/log/* "$r"/debootstrap
	# The sandbox user: uid/gid 1000, home on a tmpfs the agent mounts at boot.
	grep -q '^user:' "$r/etc/passwd" || echo 'user:x:1000:1000:sandbox user:/home/user:/bin/bash' >>"$r/etc/passwd"
	grep -q '^user:' "$r/etc/group" || echo 'user:x:1000:' >>"$r/etc/group"
	grep -q '^user:' "$r/etc/shadow" || echo 'user:!:19000::::::' >>"$r/etc/shadow"
	echo sandbox >"$r/etc/hostname"
	printf '127.0.0.1 localhost\n127.0.1.1 sandbox\n' >"$r/etc/hosts"
	mkdir -p "$r/home/user" "$r/run" "$r/tmp"
	mv "$r" "$tree"
	rm -rf "$staging" "$staging.log"
	trap - EXIT
fi

step "rootfs $image_key: packing EROFS image"
stage=$(mktemp -d "$images_dir/.rootfs-image.XXXXXX")
trap 'rm -rf "$stage"' EXIT
# Hard links make the staging copy cheap; only the agent differs from the cached tree.
cp -al "$tree" "$stage/root"
rm -f "$stage/root/usr/sbin/sbx-agent"
install -m 0755 "$agent" "$stage/root/usr/sbin/sbx-agent"
install -d -m 0755 "$stage/root/usr/lib/sbx"
install -m 0644 "${drivers[@]}" "$stage/root/usr/lib/sbx/"
source "$finish"
finish_image "$stage/root" "$stage/facts.json" "$tree_key"
run_logged "$stage/mkfs.log" mkfs.erofs -T0 "$stage/image.erofs" "$stage/root"
# The facts first: an image without them is not taken as cached (see above).
mv "$stage/facts.json" "$image.json"
mv "$stage/image.erofs" "$image"
step "rootfs $image_key: done ($(du -h "$image" | cut -f1))"
echo "$image"
