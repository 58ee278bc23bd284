#!/usr/bin/env bash
# Install the Debian packages exec-sandbox needs to build and run (idempotent: apt-get runs only
# when a package is missing). Needs root, or sudo.
set -euo pipefail
packages=(
	qemu-system-x86            # the VMM
	qemu-utils                 # qemu-img: empty copy-on-write overlays for forked work disks
	linux-source-6.1 bc bison flex libelf-dev libssl-dev build-essential patch  # guest kernel
	mmdebstrap uidmap erofs-utils unzip  # guest root file system (uidmap: unprivileged builds; unzip: the pinned node wheel)
	libseccomp-dev liburing-dev pkg-config  # C extension
	clang libclang-rt-14-dev   # fuzz targets and sanitizer builds
	python3-dev python3-venv
	skopeo                     # templates from a container image (import)
	umoci docker-registry busybox-static  # the template tests' images and loopback registry
	tmux                       # the `sbx shell` test drives it through a real terminal
)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
echo "installing system packages: ${missing[*]}" >&2
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
