#!/usr/bin/env bash
# Build the guest kernel (uncompressed vmlinux, PVH entry) from Debian's linux-source-6.1 with
# kernel/compile.sh. The source is the installed package's tarball when linux-source-6.1 is
# installed; otherwise the package file is fetched from the host's apt sources (`apt-get
# download`, no root needed) and unpacked with `dpkg-deb -x`. Cached by the hash of
# kernel/compile.sh, the config fragment, the patches and the linux-source version (see
# compile.sh). Prints the path of the vmlinux.
source "$(dirname "$0")/lib.sh"

pkg=linux-source-6.1
kdir="$images_src_dir/kernel"
src_tar=/usr/src/$pkg.tar.xz
if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' && [ -f "$src_tar" ]; then
	version=$(dpkg-query -W -f='${Version}' "$pkg")
else
	src_tar=
	version=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n1)
	[ -n "$version" ] || fail "apt knows no package $pkg: its package lists are missing or stale (run: $(as_root_hint)apt-get update)"
fi
HASH_EXTRA=$version
key=$(inputs_hash "$kdir/compile.sh" "$kdir/sandbox.config" "$kdir"/patches/*.patch)
out="$images_dir/vmlinux-$key"
if [ -f "$out" ]; then step "kernel $key: cached"; reuse "$out"; echo "$out"; exit 0; fi

staging_dir kernel-build
work=$staging
if [ -z "$src_tar" ]; then
	step "kernel $key: downloading $pkg $version (about 140 MB)"
	(cd "$work" && run_logged "$work/download.log" apt-get download -q "$pkg=$version")
	run_logged "$work/download.log" dpkg-deb -x "$work/${pkg}_"*.deb "$work/deb"
	rm -f "$work/${pkg}_"*.deb
	src_tar="$work/deb/usr/src/$pkg.tar.xz"
fi
source "$kdir/compile.sh"
compile_kernel "$src_tar" "$work" "$kdir"
cp .config "$out.config.tmp" && mv "$out.config.tmp" "$out.config"
install -m 0644 vmlinux "$out.tmp" && mv "$out.tmp" "$out"
step "kernel $key: done"
echo "$out"
