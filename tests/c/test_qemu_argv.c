/* Unit tests of the QEMU command line builder (src/_execsbx/qemu_argv.c). */
#include <errno.h>
#include <stdlib.h>

#include "net_protocol.h"
#include "protocol.h"
#include "qemu_argv.h"
#include "qemu_spawn.h"
#include "test.h"

/* Where a test does not look at the explanation of an error. */
static struct sbx_err E;

static struct sbx_vm_config base(void)
{
	return (struct sbx_vm_config){
		.qemu_binary = "/usr/bin/qemu-system-x86_64",
		.kernel = "/images/vmlinux",
		.rootfs = "/images/rootfs.erofs",
		.memory_mb = 256,
		.vcpus = 1,
		.accel = "tcg",
		.kernel_cmdline_extra = "",
	};
}

/* Index of the first argv entry equal to s, or -1. */
static int find(char **argv, const char *s)
{
	for (int i = 0; argv[i]; i++)
		if (strcmp(argv[i], s) == 0)
			return i;
	return -1;
}

/* The value following option opt. */
static const char *opt_value(char **argv, const char *opt)
{
	int i = find(argv, opt);
	return i < 0 ? NULL : argv[i + 1];
}

static void test_full_tcg_command_line(void)
{
	static const char *const expected[] = {
		"/usr/bin/qemu-system-x86_64",
		"-M", "microvm,x-option-roms=off,isa-serial=off,acpi=off,memory-backend=ram0",
		"-object", "memory-backend-ram,id=ram0,size=256M",
		"-accel", "tcg,tb-size=128", "-cpu", "max,-erms",
		"-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", "/images/vmlinux",
		"-append",
		"console=hvc0 quiet root=/dev/vda rootfstype=erofs ro init=/usr/sbin/sbx-agent "
		"panic=-1 random.trust_cpu=on lapic_timer_khz=1000000 no_timer_check tsc=reliable",
		"-drive", "file=/images/rootfs.erofs,if=none,id=root,format=raw,readonly=on",
		"-device", "virtio-blk-device,drive=root",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=con,fd=4", "-device", "virtconsole,chardev=con",
		"-chardev", "socket,id=agent,fd=3",
		"-device", "virtserialport,chardev=agent,name=org.execsandbox.agent.0",
		NULL,
	};
	struct sbx_vm_config c = base();
	char **argv = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK(argv != NULL);
	if (!argv)
		return;
	unsigned n = sbx_argv_count(argv);
	CHECK_EQ(n, sizeof(expected) / sizeof(expected[0]) - 1);
	for (unsigned i = 0; i < n && expected[i]; i++)
		CHECK_STR(argv[i], expected[i]);
	CHECK(argv[n] == NULL);
	sbx_argv_free(argv);
}

static void test_accel_kvm_vs_tcg(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	c.accel = "kvm";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-accel"), "kvm");
	CHECK_STR(opt_value(argv, "-cpu"), "host");
	/* The TCG boot shortcuts (timer calibration) are not for a CPU with a TSC-deadline timer. */
	CHECK(strstr(opt_value(argv, "-append"), "lapic_timer_khz") == NULL);
	sbx_argv_free(argv);
	c.accel = "tcg";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-accel"), "tcg,tb-size=128");
	CHECK_STR(opt_value(argv, "-cpu"), "max,-erms");
	CHECK(strstr(opt_value(argv, "-append"), " lapic_timer_khz=1000000 no_timer_check tsc=reliable") != NULL);
	sbx_argv_free(argv);

	struct sbx_err why = {0};
	c.accel = "hvf";
	argv = (char **)1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK(argv == NULL);
	CHECK(why.msg[0] != 0);
	c.accel = "KVM";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c.accel = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
}

static void test_memory_and_vcpus(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	c.memory_mb = 4096;
	c.vcpus = 4;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-m"), "4096");
	CHECK_STR(opt_value(argv, "-smp"), "4");
	sbx_argv_free(argv);

	c = base();
	c.memory_mb = SBX_VM_MEMORY_MB_MIN - 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c.memory_mb = SBX_VM_MEMORY_MB_MAX + 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c.memory_mb = SBX_VM_MEMORY_MB_MIN;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	sbx_argv_free(argv);
	c = base();
	c.vcpus = 0;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c.vcpus = SBX_VM_VCPUS_MAX + 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
}

static void test_append_line(void)
{
	const char *fixed = "console=hvc0 quiet root=/dev/vda rootfstype=erofs ro "
			    "init=/usr/sbin/sbx-agent panic=-1 random.trust_cpu=on "
			    "lapic_timer_khz=1000000 no_timer_check tsc=reliable";
	struct sbx_vm_config c = base();
	char **argv;
	c.kernel_cmdline_extra = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-append"), fixed);
	sbx_argv_free(argv);

	c.kernel_cmdline_extra = "tsc=reliable tsc_khz=2600000";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	char want[512];
	snprintf(want, sizeof(want), "%s %s", fixed, c.kernel_cmdline_extra);
	CHECK_STR(opt_value(argv, "-append"), want);
	sbx_argv_free(argv);

	struct sbx_err why = {0};
	c.kernel_cmdline_extra = "a\nb";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK(strstr(why.msg, "control"));

	/* The kernel truncates at 2047 bytes: too long is refused, not silently cut. */
	char *lng = malloc(SBX_KERNEL_CMDLINE_MAX + 1);
	size_t room = SBX_KERNEL_CMDLINE_MAX - strlen(fixed) - 1;
	memset(lng, 'x', room);
	lng[room] = 0;
	c.kernel_cmdline_extra = lng;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_EQ(strlen(opt_value(argv, "-append")), SBX_KERNEL_CMDLINE_MAX);
	sbx_argv_free(argv);
	lng[room] = 'x';
	lng[room + 1] = 0;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -E2BIG);
	free(lng);
}

static void test_comma_rejection(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	struct sbx_err why = {0};
	c.rootfs = "/images/root,file=/etc/shadow";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK(strstr(why.msg, "','"));
	c.rootfs = "/images/root,";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c = base();
	c.kernel = "/a,b/vmlinux";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	/* A comma in the QEMU binary path is fine: it is only execve's path and argv[0]. */
	c = base();
	c.qemu_binary = "/opt/q,emu/qemu-system-x86_64";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(argv[0], "/opt/q,emu/qemu-system-x86_64");
	sbx_argv_free(argv);
}

static void test_relative_and_empty_paths(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	struct sbx_err why = {0};
	/* A relative rootfs must never be read as a block protocol ("nbd:...", "json:{...}"). */
	c.rootfs = "json:{\"driver\":\"nbd\"}";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-drive"),
		  "file=./json:{\"driver\":\"nbd\"},if=none,id=root,format=raw,readonly=on");
	sbx_argv_free(argv);
	c.rootfs = "images/rootfs.erofs";
	c.kernel = "vmlinux";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-drive"),
		  "file=./images/rootfs.erofs,if=none,id=root,format=raw,readonly=on");
	CHECK_STR(opt_value(argv, "-kernel"), "vmlinux");
	sbx_argv_free(argv);
	c.rootfs = "";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK(strstr(why.msg, "empty"));
	c.rootfs = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c = base();
	c.kernel = "";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c.kernel = "/boot/vm\tlinux";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c = base();
	c.qemu_binary = "";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
	c.qemu_binary = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), -EINVAL);
}

/* Under the jail the images are the host's fds: QEMU's paths are /proc/self/fd/8, 9, and 10 + i
 * for disk i. */
static void test_images_by_fd(void)
{
	struct sbx_vm_config c = base();
	char **argv = NULL;
	const struct sbx_vm_disk disks[] = {{"/cache/packages/python.erofs", "python", 0, 0, 0, 0},
					    {"/cache/templates/t.erofs", "template", 0, 0, 0, 0},
					    {"/tmp/build/source.erofs", "source", 0, 0, 0, 0},
					    {"/tmp/build/output.raw", "output", 1, 0, 0, 0}};
	c.images_by_fd = 1;
	c.disks = disks;
	c.ndisks = 4;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-kernel"), "/proc/self/fd/8");
	CHECK(find(argv, "file=/proc/self/fd/9,if=none,id=root,format=raw,readonly=on") > 0);
	CHECK(find(argv, "file=/proc/self/fd/10,if=none,id=disk0,format=raw,readonly=on") > 0);
	CHECK(find(argv, "file=/proc/self/fd/11,if=none,id=disk1,format=raw,readonly=on") > 0);
	CHECK(find(argv, "file=/proc/self/fd/12,if=none,id=disk2,format=raw,readonly=on") > 0);
	CHECK(find(argv, "file=/proc/self/fd/13,if=none,id=disk3,format=raw,readonly=off,"
			 "werror=report,rerror=report,discard=unmap") > 0);
	for (char **a = argv; *a; a++)
		CHECK(strstr(*a, "/cache/") == NULL && strstr(*a, "/tmp/") == NULL);
	sbx_argv_free(argv);
}

static void test_drive_and_channel(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-drive"),
		  "file=/images/rootfs.erofs,if=none,id=root,format=raw,readonly=on");
	CHECK_STR(opt_value(argv, "-kernel"), "/images/vmlinux");
	CHECK(find(argv, "virtserialport,chardev=agent,name=" SBX_CHANNEL_PORT_NAME) > 0);
	CHECK(find(argv, "socket,id=agent,fd=3") > 0);
	CHECK(find(argv, "socket,id=con,fd=4") > 0);
	CHECK(find(argv, "-sandbox") < 0);
	CHECK(find(argv, "-nodefaults") > 0);
	CHECK(find(argv, "-no-reboot") > 0);
	sbx_argv_free(argv);
	sbx_argv_free(NULL);
	CHECK_EQ(sbx_argv_count(NULL), 0);
}

static void test_snapshot_template_and_clone(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	/* Without snapshot options: no QMP, anonymous RAM (still the backend ram0), no -incoming. */
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK(find(argv, "-mon") < 0);
	CHECK_STR(opt_value(argv, "-object"), "memory-backend-ram,id=ram0,size=256M");
	CHECK(find(argv, "-incoming") < 0);
	sbx_argv_free(argv);

	/* A template: RAM in a shared file, QMP on fd 5. */
	c.qmp = 1;
	c.mem_path = "/cache/snap/ram";
	c.mem_shared = 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-M"),
		  "microvm,x-option-roms=off,isa-serial=off,acpi=off,memory-backend=ram0");
	CHECK_STR(opt_value(argv, "-object"),
		  "memory-backend-file,id=ram0,size=256M,mem-path=/cache/snap/ram,share=on");
	CHECK(find(argv, "socket,id=qmp,fd=5") > 0);
	CHECK_STR(opt_value(argv, "-mon"), "chardev=qmp,mode=control");
	CHECK(find(argv, "-incoming") < 0);
	sbx_argv_free(argv);

	/* A clone: the same file mapped private, waiting for the migration stream. */
	c.mem_shared = 0;
	c.incoming = 1;
	c.mem_path = "snap/ram";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK_STR(opt_value(argv, "-object"),
		  "memory-backend-file,id=ram0,size=256M,mem-path=./snap/ram,share=off");
	CHECK_STR(opt_value(argv, "-incoming"), "defer");
	sbx_argv_free(argv);

	struct sbx_err why = {0};
	c.mem_path = "/a,b";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "mem_path must not contain ','");
	c.mem_path = "/cache/ram";
	c.qmp = 0;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK(strstr(why.msg, "incoming needs qmp") != NULL);
}

/* No disks: the root alone. */
static void test_no_disks(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	int drives = 0;
	for (char **a = argv; *a; a++)
		drives += strcmp(*a, "-drive") == 0;
	CHECK_EQ(drives, 1);
	sbx_argv_free(argv);
}

/* The disks come after the root (which stays /dev/vda) in the caller's order, each device named
 * by its serial for the agent. */
static void test_disks_in_order_after_the_root(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	const struct sbx_vm_disk disks[] = {{"/cache/layer.erofs", "python", 0, 0, 0, 0},
					    {"/cache/t.erofs", "template", 0, 0, 0, 0},
					    {"rel/out.raw", "output", 1, 0, 0, 0}};
	c.disks = disks;
	c.ndisks = 3;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	int root = find(argv, "virtio-blk-device,drive=root");
	int d0 = find(argv, "virtio-blk-device,drive=disk0,serial=sbx-disk-python");
	int d1 = find(argv, "virtio-blk-device,drive=disk1,serial=sbx-disk-template");
	int d2 = find(argv, "virtio-blk-device,drive=disk2,serial=sbx-disk-output");
	CHECK(root > 0 && d0 > root && d1 > d0 && d2 > d1);
	int f0 = find(argv, "file=/cache/layer.erofs,if=none,id=disk0,format=raw,readonly=on");
	CHECK(f0 > root && f0 < d0);
	CHECK(find(argv, "file=/cache/t.erofs,if=none,id=disk1,format=raw,readonly=on") > d0);
	/* a relative path gets "./" (not a block protocol prefix), as the root's does */
	CHECK(find(argv, "file=./rel/out.raw,if=none,id=disk2,format=raw,readonly=off,"
			 "werror=report,rerror=report,discard=unmap") > d1);
	sbx_argv_free(argv);
}

/* Read-only unless asked: readonly=on by default, off only for a writable disk, which also
 * reports I/O errors to the guest (never pauses the VM: werror=enospc is QEMU's default) and
 * passes the guest's discards on to the file. */
static void test_disk_readonly_unless_writable(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	struct sbx_vm_disk d = {"/cache/d.raw", "output", 0, 0, 0, 0};
	c.disks = &d;
	c.ndisks = 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK(find(argv, "file=/cache/d.raw,if=none,id=disk0,format=raw,readonly=on") > 0);
	sbx_argv_free(argv);
	d.writable = 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK(find(argv, "file=/cache/d.raw,if=none,id=disk0,format=raw,readonly=off,"
			 "werror=report,rerror=report,discard=unmap") > 0);
	sbx_argv_free(argv);
}

/* A forked work disk: a qcow2 overlay on a frozen raw file. The frozen one is a block node only
 * (the guest sees one disk, with the overlay's serial, at the overlay's place among the devices);
 * the overlay's device carries the error policy -drive would have. */
static void test_qcow2_overlay_on_a_backing_disk(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	struct sbx_vm_disk disks[] = {{"/cache/layer.erofs", "python", 0, 0, 0, 0},
				      {"/d/base", "workbase", 0, 0, 0, 0},
				      {"/d/top", "work", 1, 1, 2, 1ull << 32},
				      {"/v/vol", "vol", 1, 0, 0, 0}};
	c.disks = disks;
	c.ndisks = 4;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK(find(argv, "driver=file,node-name=disk1f,filename=/d/base,read-only=on,locking=off") > 0);
	CHECK(find(argv, "driver=raw,node-name=disk1,file=disk1f,read-only=on") > 0);
	CHECK(find(argv, "driver=file,node-name=disk2f,filename=/d/top,read-only=off,locking=off,"
			 "discard=unmap") > 0);
	CHECK(find(argv, "driver=qcow2,node-name=disk2,file=disk2f,backing=disk1,read-only=off,"
			 "discard=unmap") > find(argv, "driver=raw,node-name=disk1,file=disk1f,read-only=on"));
	CHECK(find(argv, "virtio-blk-device,drive=disk1,serial=sbx-disk-workbase") < 0);
	int d0 = find(argv, "virtio-blk-device,drive=disk0,serial=sbx-disk-python");
	int d2 = find(argv, "virtio-blk-device,drive=disk2,serial=sbx-disk-work,werror=report,"
			    "rerror=report");
	int d3 = find(argv, "virtio-blk-device,drive=disk3,serial=sbx-disk-vol");
	CHECK(d0 > 0 && d2 > d0 && d3 > d2);
	sbx_argv_free(argv);
}

/* The chain's rules: an overlay only on an earlier, read-only disk, one overlay per disk, and no
 * backing for a raw disk. */
static void test_bad_backing_disks(void)
{
	struct sbx_vm_config c = base();
	char **argv = NULL;
	struct sbx_err why = {0};
	struct sbx_vm_disk disks[] = {{"/d/base", "workbase", 0, 0, 0, 0}, {"/d/top", "work", 1, 1, 1, 0},
				      {"/d/top2", "other", 1, 1, 1, 0}};
	c.disks = disks;
	c.ndisks = 3;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "two disks on one backing disk");
	c.ndisks = 2;
	disks[1].backing = 2; /* itself */
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "a disk's backing disk must come earlier in the list");
	disks[1].backing = 1;
	disks[0].writable = 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "a backing disk must be read-only");
	disks[0].writable = 0;
	disks[1].qcow2 = 0;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "only a qcow2 disk has a backing disk");
	CHECK(argv == NULL);
}

/* At most SBX_VM_DISKS_MAX: one fd each under the jail, 10..15. */
static void test_too_many_disks(void)
{
	struct sbx_vm_config c = base();
	char **argv = NULL;
	struct sbx_err why = {0};
	const struct sbx_vm_disk disks[] = {{"/a", "a", 0, 0, 0, 0}, {"/b", "b", 0, 0, 0, 0}, {"/c", "c", 0, 0, 0, 0},
					    {"/d", "d", 0, 0, 0, 0}, {"/e", "e", 0, 0, 0, 0}, {"/f", "f", 0, 0, 0, 0},
					    {"/g", "g", 0, 0, 0, 0}};
	c.disks = disks;
	c.ndisks = SBX_VM_DISKS_MAX;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	sbx_argv_free(argv);
	c.ndisks = SBX_VM_DISKS_MAX + 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "at most 6 disks");
	CHECK(argv == NULL);
}

/* A kind must fit the 20-byte serial and be plain letters (it is spliced into QEMU's option
 * string); a path, like the root's, must not smuggle in options. */
static void test_bad_disk_kinds_and_paths(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	struct sbx_err why = {0};
	struct sbx_vm_disk d = {"/cache/layer.erofs", "python", 0, 0, 0, 0};
	c.disks = &d;
	c.ndisks = 1;
	static const char *const bad_kinds[] = {"", "Python", "py,serial=x", "a-b", "abcdefghijk",
						"py1"};
	for (size_t i = 0; i < sizeof(bad_kinds) / sizeof(bad_kinds[0]); i++) {
		d.kind = bad_kinds[i];
		CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
		CHECK_STR(why.msg, "disk kind must be 1..10 lower-case letters");
	}
	d.kind = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	d.kind = "abcdefghij"; /* 10: the longest */
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &E), 0);
	CHECK(find(argv, "virtio-blk-device,drive=disk0,serial=sbx-disk-abcdefghij") > 0);
	sbx_argv_free(argv);

	d.path = "/a,file=/etc/shadow";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "disk path must not contain ','");
	d.path = "";
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "disk path must not be empty");
	d.path = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	c.disks = NULL;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
}

/* The agent mounts by kind: two disks of one kind are refused, not left for it to pick from. */
static void test_duplicate_disk_kinds(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	struct sbx_err why = {0};
	const struct sbx_vm_disk disks[] = {{"/a", "python", 0, 0, 0, 0}, {"/b", "template", 0, 0, 0, 0},
					    {"/c", "python", 1, 0, 0, 0}};
	c.disks = disks;
	c.ndisks = 3;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, &why), -EINVAL);
	CHECK_STR(why.msg, "two disks of kind \"python\"");
}

/* The network port: a third virtserialport on fd 7, named as net_protocol.h says,
 * only when asked for; a plain VM keeps its two ports (its device layout is its snapshot key). */
static void test_network_port(void)
{
	struct sbx_vm_config c = base();
	char **argv;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, NULL), 0);
	CHECK(find(argv, "virtio-serial-device,max_ports=2") > 0);
	CHECK(find(argv, "socket,id=net,fd=7") < 0);
	CHECK(find(argv, "virtserialport,chardev=net,name=" SBX_NET_PORT_NAME) < 0);
	sbx_argv_free(argv);

	c.net_port = 1;
	CHECK_EQ(sbx_qemu_argv_build(&c, &argv, NULL), 0);
	CHECK(find(argv, "virtio-serial-device,max_ports=3") > 0);
	CHECK(find(argv, "virtio-serial-device,max_ports=2") < 0);
	int agent = find(argv, "virtserialport,chardev=agent,name=" SBX_CHANNEL_PORT_NAME);
	int chardev = find(argv, "socket,id=net,fd=7");
	int port = find(argv, "virtserialport,chardev=net,name=" SBX_NET_PORT_NAME);
	CHECK(agent > 0);
	CHECK(chardev > agent);
	CHECK(port > chardev);
	CHECK_STR(argv[chardev - 1], "-chardev");
	CHECK_STR(argv[port - 1], "-device");
	CHECK_EQ(SBX_CHILD_NET_FD, 7);
	sbx_argv_free(argv);
}

int main(void)
{
	RUN(test_full_tcg_command_line);
	RUN(test_accel_kvm_vs_tcg);
	RUN(test_memory_and_vcpus);
	RUN(test_append_line);
	RUN(test_comma_rejection);
	RUN(test_relative_and_empty_paths);
	RUN(test_drive_and_channel);
	RUN(test_images_by_fd);
	RUN(test_snapshot_template_and_clone);
	RUN(test_no_disks);
	RUN(test_disks_in_order_after_the_root);
	RUN(test_disk_readonly_unless_writable);
	RUN(test_too_many_disks);
	RUN(test_qcow2_overlay_on_a_backing_disk);
	RUN(test_bad_backing_disks);
	RUN(test_bad_disk_kinds_and_paths);
	RUN(test_duplicate_disk_kinds);
	RUN(test_network_port);
	TEST_MAIN_END("test_qemu_argv");
}
