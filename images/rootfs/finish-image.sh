# Last touches to the guest root tree before it is packed (sourced by build-rootfs.sh, part of the
# image's hash). The tree is a hard-linked copy of the cached package tree: replace files, never
# write into them.

# finish_image ROOT FACTS_JSON TREE_KEY
finish_image() {
	local r=$1 facts=$2 tree_key=$3
	local py glibc
	py=$(cd "$r/usr/bin" && ls -1 python3.[0-9]* | grep -E '^python3\.[0-9]+$' | sort -V | tail -n1)
	py=${py#python}
	glibc=$(sed -n '/^Package: libc6$/,/^$/s/^Version: \([0-9]*\.[0-9]*\).*/\1/p' "$r/var/lib/dpkg/status")
	[ -n "$py" ] && [ -n "$glibc" ] || { echo "cannot tell the guest's python ($py) or glibc ($glibc)" >&2; return 1; }

	# Package layers (docs/packages.md): the agent mounts a VM's layer at
	# /usr/lib/sbx/layers/<language>; the interpreters find it through these links, which name
	# places they already search: python's site directory for /usr/local, and for node the
	# node_modules at the root of the file system, where both require() and import (ESM ignores
	# NODE_PATH) end their walk up from the code file or the working directory.
	install -d -m 0755 "$r/usr/lib/sbx/layers/python" "$r/usr/lib/sbx/layers/javascript"
	local site="$r/usr/local/lib/python$py/dist-packages"
	install -d -m 0755 "$(dirname "$site")"
	rmdir "$site" 2>/dev/null || true
	ln -sfn /usr/lib/sbx/layers/python "$site"
	ln -sfn /usr/lib/sbx/layers/javascript "$r/node_modules"

	# pip inside a session (docs/packages.md, "Installs from inside"): the image has no pip; these
	# commands and `python3 -m pip` run exec_sandbox_guest._install, which asks the host to install.
	install -d -m 0755 "$r/usr/local/bin" "$r/usr/lib/python3/dist-packages/pip"
	local cmd
	for cmd in pip pip3 "pip$py"; do
		printf '#!/bin/sh\nexec /usr/bin/python3 -m pip "$@"\n' >"$r/usr/local/bin/$cmd"
		chmod 0755 "$r/usr/local/bin/$cmd"
	done
	# npm likewise (exec_sandbox_guest._npm): the image has none of its own.
	printf '#!/bin/sh\nexec /usr/bin/python3 -m exec_sandbox_guest._npm "$@"\n' >"$r/usr/local/bin/npm"
	chmod 0755 "$r/usr/local/bin/npm"
	printf '"""exec-sandbox: pip served by the host (exec_sandbox_guest._install)."""\n' \
		>"$r/usr/lib/python3/dist-packages/pip/__init__.py"
	printf 'from exec_sandbox_guest._install import run\n\nrun()\n' \
		>"$r/usr/lib/python3/dist-packages/pip/__main__.py"

	# The image is packed with zeroed timestamps (mkfs.erofs -T0), so the timestamp-checked .pyc
	# files Debian's install wrote are stale in every VM: python recompiles (in memory: the root
	# is read-only) each module it imports, every time. Hash-based .pyc files that are never
	# checked against their source fit a read-only image. Compiled by the guest's own
	# interpreter (its loader and libraries from the tree), so the bytecode is the guest's. In one
	# process (-j 1): compileall's workers (a forkserver from 3.13 on) re-run the interpreter
	# without the tree's loader, which the host's older glibc cannot start.
	step "rootfs: compiling python$py's bytecode (hash-based)"
	local pyroot="$r/usr/lib/python$py"
	PYTHONHOME="$r/usr" PYTHONDONTWRITEBYTECODE= \
		"$r/lib64/ld-linux-x86-64.so.2" --library-path "$r/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu" \
		"$r/usr/bin/python$py" -I -m compileall -q -f -j 1 --invalidation-mode unchecked-hash \
		-s "$r" -p / "$pyroot" "$r/usr/lib/python3/dist-packages" >"$r.compileall.log" 2>&1 || true
	# Modules that are links to an absolute path (Debian's sitecustomize.py -> /etc/python3.X/)
	# resolve against the host's root here, so compileall skipped or misread them: compiled from
	# their target in the tree, under the name python imports them by.
	local link target
	while IFS= read -r link; do
		target=$(readlink "$link")
		case $target in /*) ;; *) continue ;; esac
		[ -f "$r$target" ] || continue
		PYTHONDONTWRITEBYTECODE= "$r/lib64/ld-linux-x86-64.so.2" \
			--library-path "$r/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu" "$r/usr/bin/python$py" -I -c '
import importlib.util, py_compile, sys
source, name, shown = sys.argv[1:]
py_compile.compile(source, cfile=importlib.util.cache_from_source(name), dfile=shown, doraise=True,
                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)' \
			"$r$target" "$link" "${link#"$r"}" >>"$r.compileall.log" 2>&1 || true
	done < <(find "$pyroot" "$r/usr/lib/python3/dist-packages" -type l -name '*.py')
	# compileall fails for the odd file that is not python 3 (test data); what matters is that
	# the modules every start imports are compiled the new way: flags 0b01 = hash-based, unchecked.
	local flags
	flags=$(od -An -j4 -N4 -tu4 "$pyroot/__pycache__/os.cpython-${py/./}.pyc" | tr -d ' ')
	[ "$flags" = 1 ] || { echo "bytecode of the image was not recompiled:"; tail -n 20 "$r.compileall.log"; return 1; } >&2
	rm -f "$r.compileall.log"

	# Network by name: the guest has no network device; names resolve through the
	# agent's DNS stub (guest/src/net_dns.h), never through the resolver of the host that built
	# the image. In a VM without network nothing listens there: a lookup fails at once (the
	# kernel answers "port unreachable" on loopback). One attempt: the stub answers at once or
	# not at all.
	rm -f "$r/etc/resolv.conf"
	printf 'nameserver 127.0.0.53\noptions attempts:1 timeout:2\n' >"$r/etc/resolv.conf"
	# One CA bundle for every client: the system bundle's path becomes a link to the file the
	# agent points it at (the image's bundle at boot, the host's after NET_CONFIG), and the
	# image's own bundle moves to where the agent's boot link finds it.
	if [ -f "$r/etc/ssl/certs/ca-certificates.crt" ] && [ ! -L "$r/etc/ssl/certs/ca-certificates.crt" ]; then
		install -d -m 0755 "$r/usr/lib/sbx"
		mv "$r/etc/ssl/certs/ca-certificates.crt" "$r/usr/lib/sbx/ca-certificates.crt"
		ln -s /run/sbx/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
	fi

	# Node's version and whether it has node's built-in startup snapshot (then the host builds it no
	# user-land one: snapshots/node_startup.py), asked of the guest's node itself.
	local node
	node=$("$r/lib64/ld-linux-x86-64.so.2" --library-path "$r/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu" \
		"$r/usr/bin/node" -p 'process.versions.node + " " + (process.config.variables.node_use_node_snapshot === true)') ||
		{ echo "the guest's node does not start" >&2; return 1; }
	printf '{"python": "%s", "glibc": "%s", "tree": "%s", "node": "%s", "node_snapshot": %s}\n' \
		"$py" "$glibc" "$tree_key" "${node% *}" "${node#* }" >"$facts"
}
