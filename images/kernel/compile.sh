# The guest kernel's build steps (sourced by build-kernel.sh). This file, the config fragment,
# the patches and the linux-source version are the kernel's cache key: they alone decide the
# vmlinux. How the source arrives (installed package or a downloaded .deb) is not in the key,
# so changing build-kernel.sh does not recompile the kernel.

# compile_kernel SRC_TAR WORK KERNEL_DIR: unpack SRC_TAR into WORK, patch, configure
# (tinyconfig + sandbox.config), build; leaves WORK/linux-source-6.1/{vmlinux,.config}.
compile_kernel() {
	local src_tar=$1 work=$2 kdir=$3 p sym
	step "kernel: unpacking $(basename "$src_tar")"
	tar -xJf "$src_tar" -C "$work"
	cd "$work"/linux-source-6.1
	for p in "$kdir"/patches/*.patch; do
		step "kernel: applying $(basename "$p")"
		patch -p1 --forward --quiet <"$p"
	done
	step "kernel: configuring (tinyconfig + sandbox.config)"
	run_logged "$work/config.log" make tinyconfig
	run_logged "$work/config.log" scripts/kconfig/merge_config.sh -m .config "$kdir/sandbox.config"
	run_logged "$work/config.log" make olddefconfig
	# merge_config does not fail when a symbol is dropped: check the ones the boot depends on.
	for sym in PVH VIRTIO_MMIO VIRTIO_CONSOLE VIRTIO_BLK EROFS_FS TMPFS DEVTMPFS_MOUNT; do
		grep -q "^CONFIG_$sym=y" .config || { echo "kernel config lost CONFIG_$sym" >&2; return 1; }
	done
	for sym in MODULES IO_URING BPF_SYSCALL KEXEC USER_NS; do
		if grep -q "^CONFIG_$sym=y" .config; then echo "kernel config has CONFIG_$sym" >&2; return 1; fi
	done
	step "kernel: compiling vmlinux on $(nproc) cores (several minutes)"
	run_logged "$work/build.log" make -j"$(nproc)" vmlinux
}
