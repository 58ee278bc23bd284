#!/usr/bin/env bash
# Build the guest kernel (uncompressed vmlinux, PVH entry) from Debian's linux-source-6.1:
# apply images/kernel/patches/*.patch, `make tinyconfig`, merge images/kernel/sandbox.config,
# build. Cached by the hash of the config, the patches, this script and the linux-source package
# version. Prints the path of the vmlinux.
source "$(dirname "$0")/lib.sh"

src_tar=/usr/src/linux-source-6.1.tar.xz
[ -f "$src_tar" ] || { echo "missing $src_tar: apt-get install linux-source-6.1" >&2; exit 1; }
HASH_EXTRA=$(dpkg-query -W -f='${Version}' linux-source-6.1)
patches=("$images_src_dir"/kernel/patches/*.patch)
key=$(inputs_hash "$images_src_dir/kernel/sandbox.config" "${patches[@]}" "$0")
out="$images_dir/vmlinux-$key"
if [ -f "$out" ]; then step "kernel $key: cached"; reuse "$out"; echo "$out"; exit 0; fi

work=$(mktemp -d "$images_dir/.kernel-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
step "kernel $key: unpacking linux-source-6.1"
tar -xJf "$src_tar" -C "$work"
cd "$work"/linux-source-6.1
for p in "${patches[@]}"; do
	step "kernel $key: applying $(basename "$p")"
	patch -p1 --forward --quiet <"$p"
done
step "kernel $key: configuring (tinyconfig + sandbox.config)"
run_logged "$work/config.log" make tinyconfig
run_logged "$work/config.log" scripts/kconfig/merge_config.sh -m .config "$images_src_dir/kernel/sandbox.config"
run_logged "$work/config.log" make olddefconfig
# merge_config does not fail when a symbol is dropped: check the ones the boot depends on.
for sym in PVH VIRTIO_MMIO VIRTIO_CONSOLE VIRTIO_BLK EROFS_FS TMPFS DEVTMPFS_MOUNT; do
	grep -q "^CONFIG_$sym=y" .config || { echo "kernel config lost CONFIG_$sym" >&2; exit 1; }
done
for sym in MODULES IO_URING BPF_SYSCALL KEXEC USER_NS; do
	if grep -q "^CONFIG_$sym=y" .config; then echo "kernel config has CONFIG_$sym" >&2; exit 1; fi
done
step "kernel $key: compiling vmlinux on $(nproc) cores (several minutes)"
run_logged "$work/build.log" make -j"$(nproc)" vmlinux
cp .config "$images_dir/vmlinux-$key.config"
install -m 0644 vmlinux "$out.tmp" && mv "$out.tmp" "$out"
step "kernel $key: done"
echo "$out"
