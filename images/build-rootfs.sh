#!/usr/bin/env bash
# Build the guest root file system: a Debian trixie tree from Debian's packages (rootfs/
# make-tree.sh: mmdebstrap minbase + rootfs/packages.txt, from the host's apt mirror, unprivileged
# where the host allows user namespaces) plus the pinned wheels (rootfs/pinned-wheels.txt: node),
# fetched by the host's pip, with the guest agent installed as /usr/sbin/sbx-agent, packed as a
# read-only EROFS image. Two cache levels, both keyed by content hash:
#   rootfs-tree-<H1>/      the unpacked package tree (H1: package list, wheel pins, make-tree.sh,
#                          install-wheels.sh, suite, mirror)
#   rootfs-<H2>.erofs      the image (H2: H1 + the agent binary and node addon + the REPL drivers +
#                          the guest runtime + rootfs/finish-image.sh), with rootfs-<H2>.erofs.json
#                          beside it: the facts the host needs about the image (python version,
#                          glibc)
# so that rebuilding the agent only re-runs mkfs.erofs. Usage: build-rootfs.sh AGENT_BINARY.
# Prints the image path.
source "$(dirname "$0")/lib.sh"

# build-rootfs.sh --pack STAGE TREE AGENT TREE_KEY: the packing, run where the tree's files have
# their owners (in_tree_ns); leaves STAGE/image.erofs and STAGE/facts.json.
if [ "${1:-}" = --pack ]; then
	stage=$2 tree=$3 agent=$4 tree_key=$5
	# Hard links make the staging copy cheap; only the agent and drivers differ from the tree.
	cp -al "$tree/." "$stage/root"
	rm -f "$stage/root/usr/sbin/sbx-agent"
	install -m 0755 "$agent" "$stage/root/usr/sbin/sbx-agent"
	install -d -m 0755 "$stage/root/usr/lib/sbx"
	install -m 0644 "$images_src_dir"/../guest/repl/driver.{py,js,sh} "$images_src_dir"/../guest/repl/prestart.js "$stage/root/usr/lib/sbx/"
	install -m 0644 "$(dirname "$agent")/sbx-reseed.node" "$stage/root/usr/lib/sbx/"
	# The template builder's script (guest/template/), run by the agent in builder mode.
	install -m 0755 "$images_src_dir"/../guest/template/build.sh "$stage/root/usr/lib/sbx/template-build"
	# The guest runtime (guest/runtime/): node's `tools` beside the drivers; the python package
	# where Debian's python3 imports it without PYTHONPATH, with the .pth file that makes `tools`
	# and `display` built-ins (compiled to bytecode by finish_image with the rest).
	install -m 0644 "$images_src_dir"/../guest/runtime/node/tools.js "$images_src_dir"/../guest/runtime/node/tools_global.js "$images_src_dir"/../guest/runtime/node/ts_hook.js "$stage/root/usr/lib/sbx/"
	debian_py="$stage/root/usr/lib/python3/dist-packages"
	install -d -m 0755 "$debian_py/exec_sandbox_guest"
	install -m 0644 "$images_src_dir"/../guest/runtime/python/exec_sandbox_guest/*.py "$debian_py/exec_sandbox_guest/"
	install -m 0644 "$images_src_dir"/../guest/runtime/python/exec_sandbox_guest.pth "$debian_py/"
	# And beside the drivers, which a template VM binds into its root: a template's own python
	# finds it there through the session driver (guest/repl/driver.py).
	install -d -m 0755 "$stage/root/usr/lib/sbx/python/exec_sandbox_guest"
	install -m 0644 "$images_src_dir"/../guest/runtime/python/exec_sandbox_guest/*.py "$stage/root/usr/lib/sbx/python/exec_sandbox_guest/"
	source "$images_src_dir/rootfs/finish-image.sh"
	finish_image "$stage/root" "$stage/facts.json" "$tree_key"
	run_logged "$stage/mkfs.log" mkfs.erofs -T0 "$stage/image.erofs" "$stage/root"
	exit 0
fi

agent=${1:?usage: build-rootfs.sh path/to/sbx-agent}
[ -x "$agent" ] || fail "agent binary $agent missing: make -C guest"
suite=trixie
mirror=$(debian_mirror "$suite")
packages=$(grep -v '^\s*#' "$images_src_dir/rootfs/packages.txt" | grep -v '^\s*$' | paste -sd, -)

HASH_EXTRA="$mirror $suite"
pins="$images_src_dir/rootfs/pinned-wheels.txt"
tree_key=$(inputs_hash "$images_src_dir/rootfs/packages.txt" "$pins" "$images_src_dir/rootfs/make-tree.sh" "$images_src_dir/rootfs/install-wheels.sh")
tree="$images_dir/rootfs-tree-$tree_key"
HASH_EXTRA="$tree_key"
# The session REPL drivers and node's pre-start preload (guest/repl/) go to /usr/lib/sbx.
drivers=("$images_src_dir"/../guest/repl/driver.py "$images_src_dir"/../guest/repl/driver.js "$images_src_dir"/../guest/repl/driver.sh "$images_src_dir"/../guest/repl/prestart.js)
# The template builder's script (guest/template/build.sh), /usr/lib/sbx/template-build.
drivers+=("$images_src_dir"/../guest/template/build.sh)
# The guest runtime (guest/runtime/), installed beside them and into python's dist-packages.
runtime=("$images_src_dir"/../guest/runtime/node/tools.js "$images_src_dir"/../guest/runtime/node/tools_global.js "$images_src_dir"/../guest/runtime/node/ts_hook.js "$images_src_dir"/../guest/runtime/python/exec_sandbox_guest.pth "$images_src_dir"/../guest/runtime/python/exec_sandbox_guest/*.py)
finish="$images_src_dir/rootfs/finish-image.sh"
# The node addon (guest/node/) is built beside the agent, and installed beside the drivers.
addon="$(dirname "$agent")/sbx-reseed.node"
[ -f "$addon" ] || fail "node addon $addon missing: make -C guest"
image_key=$(inputs_hash "$agent" "$addon" "${drivers[@]}" "${runtime[@]}" "$finish")
image="$images_dir/rootfs-$image_key.erofs"
reuse "$tree"
if [ -f "$image" ] && [ -f "$image.json" ]; then
	step "rootfs $image_key: cached"; reuse "$image"; echo "$image"; exit 0
fi

if [ ! -d "$tree" ]; then
	staging_dir rootfs-tree
	step "rootfs: mmdebstrap $suite minbase + $(echo "$packages" | tr , '\n' | wc -l) packages (a few minutes)"
	run_logged "$staging/mmdebstrap.log" bash "$images_src_dir/rootfs/make-tree.sh" "$staging/root" "$suite" "$mirror" "$packages"
	# The wheels through the host's pip (its index configuration and credentials; the python
	# `sbx setup` runs under), wheels only, each file checked against its pinned SHA-256.
	step "rootfs: fetching the pinned wheels (node)"
	python=${EXEC_SANDBOX_PYTHON:-python3}
	mkdir "$staging/wheels"
	run_logged "$staging/pip.log" "$python" -m pip download --quiet --disable-pip-version-check \
		--no-deps --only-binary=:all: --require-hashes -r "$pins" -d "$staging/wheels"
	in_tree_ns bash "$images_src_dir/rootfs/install-wheels.sh" "$staging/root" "$staging/wheels"
	mv "$staging/root" "$tree"
fi

step "rootfs $image_key: packing EROFS image"
staging_dir rootfs-image
stage=$staging
in_tree_ns bash "$images_src_dir/build-rootfs.sh" --pack "$stage" "$tree" "$(realpath "$agent")" "$tree_key"
# The facts first: an image without them is not taken as cached (see above).
mv "$stage/facts.json" "$image.json"
mv "$stage/image.erofs" "$image"
step "rootfs $image_key: done ($(du -h "$image" | cut -f1))"
echo "$image"
