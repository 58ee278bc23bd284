#!/bin/bash
# template-build: a template's build inside the builder VM (installed as /usr/lib/sbx/template-build;
# the agent runs each subcommand as one root EXEC, in builder mode: guest/src/template.h).
#
#   template-build prepare    the tree from plan.json's source, at /run/sbx/build/root (a tmpfs)
#   template-build step N     step N of plan.json in the tree (run, copy, env, workdir, user)
#   template-build finish     sbx/env and sbx/workdir beside the tree, mkfs.erofs onto the output
#                             disk, one JSON line on stdout: size, languages, env, workdir
#
# Inputs are the host's disks, mounted read-only by the agent: /run/sbx/build/source (plan.json,
# oci/ the image layout tagged "sbx", copy/<N>/ each copy step's files) and /run/sbx/build/base (a
# base template's image). The output disk (serial sbx-disk-output) is written only by `finish`.
# The build's own state (env, workdir, user) is kept between EXECs in /run/sbx/build/state.
#
# The tree is the user's: its steps run as root in it, and its paths may be symlinks to anywhere.
# So nothing here writes through a path of the tree without checking it: directories are made
# one component at a time, refusing symlinks (tree_dir); files bound over for a step are replaced
# by plain files first and put back after; copies are extracted by tar, which replaces a symlink
# in its way instead of following it; versions are asked for inside the chroot. A failure prints
# one line on stderr and exits non-zero.
set -euo pipefail
shopt -s nullglob
# The agent gives user code no sbin in PATH; this script runs as root and needs chroot, mount.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

B=/run/sbx/build
SRC=$B/source
BASE=$B/base
STAGE=$B/stage      # tmpfs: root/ (the tree) and sbx/ (env, workdir): the image's top level
TREE=$B/root        # the tree (a bind of $STAGE/root)
STATE=$B/state
PLAN=$SRC/plan.json
CHROOT=$(command -v chroot)  # by path: the steps run under env -i
DEFAULT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The agent's limits on sbx/env (src/shared/protocol.h SBX_ENV_*).
ENV_MAX_COUNT=100 ENV_NAME_MAX=256 ENV_VALUE_MAX=32768

die() {
	printf 'template-build: %s\n' "$*" >&2
	exit 1
}
warn() { printf 'template-build: %s\n' "$*" >&2; }
# A progress line for the person waiting (the host streams stderr to the build's progress).
note() { printf '%s\n' "$*" >&2; }

[ -f "$PLAN" ] || die "no plan.json on the source disk ($PLAN)"

# tree_dir REL: the directory REL (no leading /) inside the tree, made as root where missing;
# an existing component that is a symlink or not a directory fails it (status 1), so that
# nothing made here lands outside the tree.
tree_dir() {
	local rel=$1 p=$TREE comp
	local IFS=/
	for comp in $rel; do
		[ -n "$comp" ] && [ "$comp" != . ] || continue
		[ "$comp" != .. ] || return 1
		p=$p/$comp
		if [ -L "$p" ]; then
			return 1
		elif [ -e "$p" ]; then
			[ -d "$p" ] || return 1
		else
			mkdir -m 0755 "$p" || return 1
		fi
	done
}

# --- build state --------------------------------------------------------------------------------

state_env() { cat "$STATE/env.json"; }
set_env_json() { printf '%s\n' "$1" >"$STATE/env.json.new" && mv "$STATE/env.json.new" "$STATE/env.json"; }
# merge_env: the JSON object on stdin over the build's environment. Through files: jq's arguments
# could be over the kernel's 128 KiB per argument.
merge_env() {
	cat >"$STATE/env.add.json"
	jq -s '.[0] + .[1]' "$STATE/env.json" "$STATE/env.add.json" >"$STATE/env.json.new"
	mv "$STATE/env.json.new" "$STATE/env.json"
}
state_get() { cat "$STATE/$1"; }
state_set() { printf '%s\n' "$2" >"$STATE/$1.new" && mv "$STATE/$1.new" "$STATE/$1"; }

# NAME=VALUE lines (sbx/env) into a JSON object on stdout; bad lines skipped.
env_lines_to_json() {
	jq -R -n '[inputs | select(test("^[A-Za-z_][A-Za-z0-9_]*=")) | capture("^(?<k>[^=]*)=(?<v>.*)$")]
		| map({(.k): .v}) | add // {}' <"$1"
}

# --- uid 1000 -------------------------------------------------------------------------------------

# The tree's /etc/passwd and /etc/group get uid and gid 1000 ("user", home /home/user) unless they
# have them: user code runs as 1000 in every template.
ensure_user() {
	tree_dir etc || die "the tree's /etc is not a directory"
	tree_dir home/user || die "the tree's /home/user is not a directory (or under a symlink)"
	local f
	for f in passwd group; do
		[ ! -L "$TREE/etc/$f" ] || die "the tree's /etc/$f is a symlink"
		[ -e "$TREE/etc/$f" ] || : >"$TREE/etc/$f"
	done
	local name=user
	if ! awk -F: '$3 == 1000 { found = 1 } END { exit !found }' "$TREE/etc/passwd"; then
		awk -F: '$1 == "user" { found = 1 } END { exit !found }' "$TREE/etc/passwd" && name=sbxuser
		printf '%s:x:1000:1000::/home/user:/bin/sh\n' "$name" >>"$TREE/etc/passwd"
	fi
	if ! awk -F: '$3 == 1000 { found = 1 } END { exit !found }' "$TREE/etc/group"; then
		name=user
		awk -F: '$1 == "user" { found = 1 } END { exit !found }' "$TREE/etc/group" && name=sbxuser
		printf '%s:x:1000:\n' "$name" >>"$TREE/etc/group"
	fi
	chown 1000:1000 "$TREE/home/user"
	chmod 0755 "$TREE/home/user"
}

# --- the step's mounts ----------------------------------------------------------------------------

# /proc, /dev, /etc/resolv.conf and /etc/hosts in the tree for one command, taken away after, with
# what the tree had at the two files put back.
BOUND=()
SAVED=()
bind_file() {
	local name=$1 t=$TREE/etc/$1
	if [ -L "$t" ] || { [ -e "$t" ] && [ ! -f "$t" ]; }; then
		mv -T "$t" "$TREE/etc/.sbx-saved-$name" || return 1
		SAVED+=("$name")
	fi
	if [ ! -e "$t" ] && [ ! -L "$t" ]; then
		: >"$t" || return 1
		# Removed after the step, unless what was there comes back in its place (above).
		[ -e "$TREE/etc/.sbx-saved-$name" ] || [ -L "$TREE/etc/.sbx-saved-$name" ] ||
			SAVED+=("new:$name")
	fi
	mount --bind "/etc/$name" "$t" && mount -o remount,bind,ro "$t" && BOUND+=("$t")
}

mount_for_step() {
	tree_dir proc && mount -t proc -o nosuid,nodev,noexec proc "$TREE/proc" && BOUND+=("$TREE/proc") ||
		die "cannot mount /proc in the tree (is /proc a symlink there?)"
	tree_dir dev && mount --rbind /dev "$TREE/dev" && BOUND+=("$TREE/dev") ||
		die "cannot mount /dev in the tree (is /dev a symlink there?)"
	# The CA bundle the agent got with the network (the host's trust, which may hold a proxy's
	# CA): the step's clients find it where every VM's do (run_in_tree sets SSL_CERT_FILE & co.).
	if [ -f /run/sbx/ca-certificates.crt ]; then
		tree_dir run/sbx && mount --bind /run/sbx "$TREE/run/sbx" && BOUND+=("$TREE/run/sbx") ||
			die "cannot mount /run/sbx in the tree (is /run a symlink there?)"
	fi
	tree_dir etc || die "the tree's /etc is not a directory"
	bind_file resolv.conf || warn "no /etc/resolv.conf for the step"
	[ ! -e /etc/hosts ] || bind_file hosts || warn "no /etc/hosts for the step"
}

# Whatever the step left running in the tree is killed (a daemon would hold the mounts and could
# change the tree after its step), then the mounts go and the saved files come back.
unmount_for_step() {
	local pid i s
	for pid in /proc/[0-9]*; do
		[ "$(readlink "$pid/root" 2>/dev/null)" = "$(readlink -f "$TREE")" ] || continue
		kill -KILL "${pid#/proc/}" 2>/dev/null || true
	done
	for ((i = ${#BOUND[@]} - 1; i >= 0; i--)); do
		umount -R "${BOUND[i]}" 2>/dev/null || umount -R -l "${BOUND[i]}" || true
	done
	BOUND=()
	for s in "${SAVED[@]}"; do
		case $s in
		new:*) rm -f "$TREE/etc/${s#new:}" ;;
		*) rm -f "$TREE/etc/$s" && mv -T "$TREE/etc/.sbx-saved-$s" "$TREE/etc/$s" ;;
		esac
	done
	SAVED=()
}

# uid:gid for a user name of the plan: root, user, a number, uid:gid, or a name in the tree's passwd.
resolve_user() {
	local u=$1
	case $u in
	root) echo 0:0 ;;
	user) echo 1000:1000 ;;
	*[!0-9:]* | '')
		awk -F: -v n="$u" '$1 == n { print $3 ":" $4; found = 1; exit } END { exit !found }' \
			"$TREE/etc/passwd" 2>/dev/null || die "no user $u in the tree's /etc/passwd"
		;;
	*:*) echo "$u" ;;
	*) echo "$u:$(awk -F: -v n="$u" '$3 == n { print $4; found = 1; exit } END { if (!found) print n }' "$TREE/etc/passwd" 2>/dev/null || echo "$u")" ;;
	esac
}

# run_in_tree UIDGID WORKDIR CMD: /bin/sh -c CMD in the chroot with the build's environment.
run_in_tree() {
	local ids=$1 wd=$2 cmd=$3 home=/home/user
	[ "${ids%%:*}" != 0 ] || home=/root
	local -a envv=()
	mapfile -d '' envv < <(state_env | jq -j --arg path "$DEFAULT_PATH" --arg home "$home" \
		'{PATH: $path, HOME: $home} + . | to_entries[] | "\(.key)=\(.value)\u0000"')
	if [ -f /run/sbx/ca-certificates.crt ]; then
		envv+=("SSL_CERT_FILE=/run/sbx/ca-certificates.crt" "REQUESTS_CA_BUNDLE=/run/sbx/ca-certificates.crt"
			"PIP_CERT=/run/sbx/ca-certificates.crt" "NODE_EXTRA_CA_CERTS=/run/sbx/extra-ca-certificates.crt")
	fi
	local status=0
	mount_for_step
	# cd inside the chroot: the working directory is the tree's path, symlinks and all.
	env -i "${envv[@]}" "$CHROOT" --userspec="$ids" "$TREE" /bin/sh -c \
		'cd -- "$0" || exit 125; exec /bin/sh -c "$1"' "$wd" "$cmd" </dev/null || status=$?
	unmount_for_step
	return "$status"
}

# The working directory of the steps after this one and of the template's code. Until one is set
# the steps run in / and the code in /home/user (the sandbox user's home: the VM's own, so
# nothing a build leaves there is seen at run time).
set_workdir() {
	state_set workdir "$1"
	state_set codedir "$1"
}

# --- prepare --------------------------------------------------------------------------------------

prepare_oci() {
	# umoci opens the layout read-write: a writable view of it (an overlay on a tmpfs) instead of
	# a copy. Whiteouts, links, modes and device nodes are umoci's; it refuses paths that leave
	# the tree.
	mkdir -p "$B/oci-rw" "$B/oci"
	mount -t tmpfs -o size=5%,mode=0700 tmpfs "$B/oci-rw"
	mkdir "$B/oci-rw/upper" "$B/oci-rw/work"
	mount -t overlay overlay -o "lowerdir=$SRC/oci,upperdir=$B/oci-rw/upper,workdir=$B/oci-rw/work" "$B/oci"
	note "unpacking the image's layers (umoci)"
	umoci raw unpack --image "$B/oci:sbx" "$STAGE/root" >&2 || die "umoci could not unpack the image"
	# The image config: Env and WorkingDir are the start of the build's own. Without a
	# WorkingDir, steps run in / (as a container runtime's would) and the template's code in the
	# sandbox user's home.
	local idx=$B/oci/index.json manifest config
	manifest=$(jq -r '[.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == "sbx")][0].digest // .manifests[0].digest' "$idx")
	[[ $manifest =~ ^sha256:[0-9a-f]{64}$ ]] || die "the layout's index names no manifest"
	config=$(jq -r '.config.digest' "$B/oci/blobs/sha256/${manifest#sha256:}")
	[[ $config =~ ^sha256:[0-9a-f]{64}$ ]] || die "the manifest names no config"
	local cfg=$B/oci/blobs/sha256/${config#sha256:}
	set_env_json "$(jq '[(.config.Env // [])[] | select(test("^[A-Za-z_][A-Za-z0-9_]*="))
		| capture("^(?<k>[^=]*)=(?<v>.*)$"; "s")] | map({(.k): .v}) | add // {}' "$cfg")"
	local wd
	wd=$(jq -r '.config.WorkingDir // ""' "$cfg")
	[ -z "$wd" ] || set_workdir "$wd"
	umount "$B/oci"
	umount "$B/oci-rw"
}

prepare_default() {
	# The builder's own root image (a non-recursive bind: none of the VM's mounts), minus the
	# agent's files: a template VM gets those from its agent.
	mkdir -p "$B/self"
	mount --bind / "$B/self"
	note "copying the default image's tree"
	cp -a "$B/self/." "$STAGE/root/"
	umount "$B/self"
	rm -rf "$STAGE/root/usr/sbin/sbx-agent" "$STAGE/root/usr/lib/sbx"
	set_env_json "{\"PATH\": \"/usr/local/bin:/usr/bin:/bin\"}"
}

prepare_template() {
	[ -d "$BASE/root" ] || die "no base template disk"
	cp -a "$BASE/root/." "$STAGE/root/"
	if [ -f "$BASE/sbx/env" ]; then
		set_env_json "$(env_lines_to_json "$BASE/sbx/env")"
	fi
	local wd
	if [ -f "$BASE/sbx/workdir" ]; then
		wd=$(head -n1 "$BASE/sbx/workdir")
		[ "$wd" = /home/user ] || set_workdir "$wd"
	fi
}

cmd_prepare() {
	mountpoint -q "$STAGE" && die "prepare ran already"
	mkdir -p "$STAGE" "$TREE" "$STATE"
	# The tree is RAM: most of it, the builder VM has little else to do.
	mount -t tmpfs -o size=80%,mode=0755 tmpfs "$STAGE"
	set_env_json '{}'
	state_set workdir /
	state_set codedir /home/user
	state_set user root
	local source
	source=$(jq -r '.source' "$PLAN")
	case $source in
	oci) prepare_oci ;;
	default) mkdir -m 0755 "$STAGE/root" && prepare_default ;;
	template) mkdir -m 0755 "$STAGE/root" && prepare_template ;;
	*) die "unknown source '$source' in plan.json" ;;
	esac
	[ -d "$STAGE/root" ] && [ ! -L "$STAGE/root" ] || die "the source gave no tree"
	mount --bind "$STAGE/root" "$TREE"
	# The plan's own start (the host's) over the source's.
	jq '.env // {}' "$PLAN" | merge_env
	local wd
	wd=$(jq -r '.workdir // ""' "$PLAN")
	[ -z "$wd" ] || set_workdir "$wd"
	ensure_user
	# As a container runtime does: the working directory exists (a symlinked one is left as is).
	wd=$(state_get workdir)
	tree_dir "${wd#/}" 2>/dev/null || true
	mkdir -m 0700 "$STAGE/sbx"
}

# --- step -----------------------------------------------------------------------------------------

cmd_step() {
	local n=$1 step op
	[[ $n =~ ^[0-9]+$ ]] || die "step: not a step number: $n"
	mountpoint -q "$TREE" || die "step before prepare"
	step=$(jq -c --argjson n "$n" '.steps[$n] // empty' "$PLAN")
	[ -n "$step" ] || die "plan.json has no step $n"
	op=$(jq -r '.op' <<<"$step")
	case $op in
	run)
		local cmd user ids
		cmd=$(jq -r '.cmd' <<<"$step")
		user=$(jq -r --arg d "$(state_get user)" '.user // $d' <<<"$step")
		ids=$(resolve_user "$user")
		run_in_tree "$ids" "$(state_get workdir)" "$cmd"
		;;
	copy)
		local dest from=$SRC/copy/$n
		dest=$(jq -r '.dest' <<<"$step")
		[[ $dest == /* ]] || dest=$(state_get workdir)/$dest
		[ -d "$from" ] || die "copy: no files for step $n on the source disk"
		# A file goes to dest itself, as a Dockerfile's COPY does, unless dest ends with "/" or is
		# a directory of the tree already: then into it under its own name. Renamed in a
		# scratch directory first, so that what lands in the tree is still tar's doing.
		local file into
		file=$(jq -r '.file // ""' <<<"$step")
		into=$(jq -r '.into // false' <<<"$step")
		if [ -n "$file" ] && [ "$into" != true ] && [ "$dest" != / ] &&
			! { [ -d "$TREE$dest" ] && [ ! -L "$TREE$dest" ]; }; then
			[[ $file != */* && $file != . && $file != .. ]] || die "copy: bad file name $file"
			local scratch=$B/copy-scratch
			rm -rf "$scratch" && mkdir -p "$scratch"
			cp -p "$from/$file" "$scratch/${dest##*/}" || die "copy: no file $file for step $n"
			from=$scratch
			dest=${dest%/*}
			dest=${dest:-/}
		fi
		tree_dir "${dest#/}" || die "copy: $dest in the tree is not a directory (or under a symlink)"
		# Owned by root as in the tree's other files; tar replaces what is in its way.
		tar -C "$from" --owner=0 --group=0 --numeric-owner -cf - . |
			tar -C "$TREE/${dest#/}" --numeric-owner -xpf - || die "copy: could not copy to $dest"
		rm -rf "$B/copy-scratch"
		;;
	env)
		# $NAME and ${NAME} expand from the environment so far, as a Dockerfile's ENV does.
		jq --slurpfile cur "$STATE/env.json" --arg dpath "$DEFAULT_PATH" '.vars | map_values(
			gsub("\\$\\{(?<a>[A-Za-z_][A-Za-z0-9_]*)\\}|\\$(?<b>[A-Za-z_][A-Za-z0-9_]*)";
				((.a // .b) as $n | $cur[0][$n] // (if $n == "PATH" then $dpath else "" end))))' \
			<<<"$step" | merge_env
		;;
	workdir)
		local wd
		wd=$(jq -r '.path' <<<"$step")
		[[ $wd == /* ]] || wd=$(state_get workdir)/$wd
		tree_dir "${wd#/}" 2>/dev/null ||
			run_in_tree 0:0 / "mkdir -p -- '${wd//\'/\'\\\'\'}'" || die "workdir: cannot make $wd"
		set_workdir "$wd"
		;;
	user)
		local name
		name=$(jq -r '.name' <<<"$step")
		resolve_user "$name" >/dev/null
		state_set user "$name"
		;;
	*) die "step $n: unknown op '$op'" ;;
	esac
}

# --- finish ---------------------------------------------------------------------------------------

output_disk() {
	# A host test names a file instead (no virtio disks there).
	if [ -n "${SBX_TEMPLATE_OUTPUT:-}" ]; then echo "$SBX_TEMPLATE_OUTPUT"; return 0; fi
	local s
	for s in /sys/block/vd*/serial; do
		if [ "$(cat "$s")" = sbx-disk-output ]; then
			s=${s%/serial}
			echo "/dev/${s##*/}"
			return 0
		fi
	done
	return 1
}

# The interpreter's version as the tree's own interpreter prints it (run in the chroot, bounded).
version_of() {
	local out
	out=$(run_in_tree 0:0 / "for d in /usr/local/bin /usr/bin /bin; do
		if [ -x \$d/$1 ]; then exec \$d/$1 $2; fi; done; exit 127" 2>/dev/null | head -c 64 | head -n1) || return 1
	[[ $out =~ ^[A-Za-z0-9.+_-]+$ ]] || return 1
	printf '%s' "$out"
}

cmd_finish() {
	mountpoint -q "$TREE" || die "finish before prepare"
	local dev
	dev=$(output_disk) || die "no output disk (serial sbx-disk-output)"
	ensure_user
	local langs='{}' v raw
	if v=$(version_of python3 "-c 'import platform;print(platform.python_version())'"); then
		langs=$(jq -c --arg v "$v" '. + {python: $v}' <<<"$langs")
	fi
	if v=$(version_of node --version); then
		langs=$(jq -c --arg v "$v" '. + {javascript: $v}' <<<"$langs")
	fi
	for raw in bash sh; do
		if run_in_tree 0:0 / "for d in /usr/local/bin /usr/bin /bin; do [ -x \$d/$raw ] && exit 0; done; exit 1" >/dev/null 2>&1; then
			langs=$(jq -c --arg v "$raw" '. + {raw: $v}' <<<"$langs")
			break
		fi
	done
	# sbx/env within the agent's limits: a variable the agent would skip is left out here too, so
	# that what the host records is what user code gets.
	state_env | jq -c --argjson nmax "$ENV_NAME_MAX" --argjson vmax "$ENV_VALUE_MAX" \
		--argjson cmax "$ENV_MAX_COUNT" \
		'to_entries | map(select((.key | test("^[A-Za-z_][A-Za-z0-9_]*$")) and (.key | length) <= $nmax
			and (.value | type == "string") and (.value | contains("\n") | not)
			and (.value | explode | all(. != 0)) and (.value | utf8bytelength) <= $vmax))
		| .[:$cmax] | from_entries' >"$STATE/env.final.json"
	[ "$(jq length "$STATE/env.json")" = "$(jq length "$STATE/env.final.json")" ] ||
		warn "variables the template cannot hold (a newline, over the limits) left out"
	jq -j 'to_entries[] | "\(.key)=\(.value)\n"' "$STATE/env.final.json" >"$STAGE/sbx/env"
	local wd
	wd=$(state_get codedir)
	[[ $wd == /* ]] && [ "${#wd}" -le 255 ] && [[ $wd != *$'\n'* ]] || die "bad workdir: $wd"
	# The code runs as uid 1000: its working directory is its to write in (the directory only,
	# not what is in it; never / or a directory under a symlink).
	if [ "$wd" != / ] && tree_dir "${wd#/}" 2>/dev/null && [ "$(stat -c %u "$TREE$wd")" = 0 ]; then
		chown 1000:1000 "$TREE$wd"
	fi
	printf '%s\n' "$wd" >"$STAGE/sbx/workdir"
	chmod 0644 "$STAGE/sbx/env" "$STAGE/sbx/workdir"
	chmod 0755 "$STAGE/sbx"
	# The output disk is the host's size cap (template_max_mb): say so rather than let mkfs fail.
	local need have
	need=$(du -sb "$STAGE" | cut -f1)
	have=$(blockdev --getsize64 "$dev")
	[ "$need" -lt "$have" ] || die "the template's files ($((need >> 20)) MB) do not fit in \
template_max_mb ($((have >> 20)) MB): raise SchedulerConfig.template_max_mb"
	if [ -n "$(ls -A "$TREE/home/user" 2>/dev/null)" ]; then
		warn "files under /home/user are hidden when the template runs (each VM mounts its own home there): put them elsewhere, e.g. in the WORKDIR"
	fi
	note "packing $((need >> 20)) MB of files into the template image"
	# Uncompressed: the VM reads it straight; timestamps as they are.
	mkfs.erofs --quiet "$dev" "$STAGE" >&2 ||
		die "mkfs.erofs onto the output disk failed (is the template larger than template_max_mb?)"
	sync
	# The image's size from its superblock (at 1024): blocks (u32 at +36) << blkszbits (u8 at +12).
	local magic bits blocks
	magic=$(od -An -tx4 -j1024 -N4 "$dev" | tr -d ' ')
	[ "$magic" = e0f5e1e2 ] || die "the output disk holds no EROFS image after mkfs"
	bits=$(od -An -tu1 -j1036 -N1 "$dev" | tr -d ' ')
	blocks=$(od -An -tu4 -j1060 -N4 "$dev" | tr -d ' ')
	jq -cn --argjson size "$((blocks << bits))" --argjson languages "$langs" \
		--slurpfile env "$STATE/env.final.json" --arg workdir "$wd" \
		'{size: $size, languages: $languages, env: $env[0], workdir: $workdir}'
}

case ${1:-} in
prepare) cmd_prepare ;;
step) [ $# -eq 2 ] || die "usage: template-build step N"; cmd_step "$2" ;;
finish) cmd_finish ;;
*) die "usage: template-build prepare | step N | finish" ;;
esac
