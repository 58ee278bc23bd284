/* exec_sandbox._execsbx.NetRing: the Python face of net_relay.h (one per Scheduler). Thin: each
 * method makes one relay call and returns primitives, or run() typed events; the policy and the
 * event loop stay in Python (exec_sandbox/network/). File descriptors passed in are duplicated,
 * so the caller keeps and closes its own. */
#include "py_net_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "net_relay.h"
#include "py_errors.h"

typedef struct {
	PyObject_HEAD
	struct sbx_net_ring *ring; /* NULL once closed */
} NetRingObject;

/* 0, or -1 with ValueError once closed (py_errors.c: EBADF without a failed call). */
static int check_open(NetRingObject *self)
{
	if (!self->ring) {
		struct sbx_err err = {0};
		sbx_err_set(&err, -EBADF, "I/O operation on closed NetRing");
		sbx_raise_err(&err, NULL);
		return -1;
	}
	return 0;
}

static PyObject *net_ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"entries", NULL};
	unsigned entries = 1024;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$I:NetRing", kwlist, &entries))
		return NULL;
	NetRingObject *self = (NetRingObject *)type->tp_alloc(type, 0);
	if (!self)
		return NULL;
	struct sbx_err err = {0};
	if (sbx_net_ring_new(entries, &self->ring, &err) < 0) {
		self->ring = NULL;
		Py_DECREF(self);
		return sbx_raise_err(&err, NULL);
	}
	return (PyObject *)self;
}

static void net_ring_dealloc(NetRingObject *self)
{
	PyTypeObject *tp = Py_TYPE(self);
	sbx_net_ring_free(self->ring);
	self->ring = NULL;
	tp->tp_free(self);
	Py_DECREF(tp);
}

static PyObject *net_ring_close(NetRingObject *self, PyObject *unused)
{
	(void)unused;
	sbx_net_ring_free(self->ring);
	self->ring = NULL;
	Py_RETURN_NONE;
}

static PyObject *net_ring_fileno(NetRingObject *self, PyObject *unused)
{
	(void)unused;
	if (check_open(self) < 0)
		return NULL;
	return PyLong_FromLong(sbx_net_ring_fd(self->ring));
}

/* NetRing.run() values: struct sequences, like Vm.read_events()'s (py_events.c). kind, relay and
 * (but RelayEndEvent) stream come first in the positions of the tuples they replaced. */
#define KIND_FIELD {"kind", "what happened: 'open', 'connected', 'closed', ..."}
#define RELAY_FIELD {"relay", "the relay (VM) it is about: add_relay()'s id"}
#define STREAM_FIELD {"stream", "the stream's id on that relay"}

static PyStructSequence_Field open_fields[] = {
	KIND_FIELD, RELAY_FIELD, STREAM_FIELD,
	{"name", "the name the guest wants (str, lowercase ASCII; not checked yet)"},
	{"port", "the port it wants"}, {NULL, NULL}};
static PyStructSequence_Field connected_fields[] = {
	KIND_FIELD, RELAY_FIELD, STREAM_FIELD,
	{"status", "the guest's answer to connect(): 0 (OK) or a refusal status"}, {NULL, NULL}};
static PyStructSequence_Field closed_fields[] = {
	KIND_FIELD, RELAY_FIELD, STREAM_FIELD,
	{"bytes_to_guest", "bytes the host's socket gave the guest"},
	{"bytes_from_guest", "bytes the guest gave the host's socket"},
	{"reset", "bool: it ended in a reset or error, not a clean close"}, {NULL, NULL}};
static PyStructSequence_Field refused_fields[] = {
	KIND_FIELD, RELAY_FIELD, STREAM_FIELD,
	{"name", "the name the guest wanted (str)"}, {"port", "the port it wanted"},
	{"status", "the refusal the relay answered (TOO_MANY)"}, {NULL, NULL}};
static PyStructSequence_Field guest_refused_fields[] = {
	KIND_FIELD, RELAY_FIELD,
	{"what", "'name' (its DNS stub refused it), 'address' (a connection to an address no "
		 "allowed name was given) or 'dropped' (reports left out by a rate limit)"},
	{"subject", "the name or the address (str; empty for 'dropped')"},
	{"port", "the port (0 for 'name' and 'dropped')"},
	{"attempts", "how many attempts it stands for (1 but for 'dropped')"}, {NULL, NULL}};
static PyStructSequence_Field relay_end_fields[] = {
	KIND_FIELD, RELAY_FIELD, {"reason", "why the relay is dead (str)"}, {NULL, NULL}};

static PyStructSequence_Desc net_event_descs[SBX_PY_NET_EVENT_TYPES] = {
	[SBX_PY_NET_OPEN_EVENT] = {"exec_sandbox._execsbx.NetOpenEvent",
				   "The guest wants a connection ('open'): answer with open_reply().",
				   open_fields, 5},
	[SBX_PY_NET_CONNECTED_EVENT] = {"exec_sandbox._execsbx.NetConnectedEvent",
					"The guest answered connect() ('connected').",
					connected_fields, 4},
	[SBX_PY_NET_CLOSED_EVENT] = {"exec_sandbox._execsbx.NetClosedEvent",
				     "A stream ended ('closed'), with what it carried.", closed_fields,
				     6},
	[SBX_PY_NET_RELAY_END_EVENT] = {"exec_sandbox._execsbx.NetRelayEndEvent",
					"The relay is dead: 'violation' (kill the VM) or "
					"'port_closed'.",
					relay_end_fields, 3},
	[SBX_PY_NET_REFUSED_EVENT] = {"exec_sandbox._execsbx.NetRefusedEvent",
				      "An OPEN the relay refused itself ('refused'): already "
				      "answered, for the log only.",
				      refused_fields, 6},
	[SBX_PY_NET_GUEST_REFUSED_EVENT] = {"exec_sandbox._execsbx.NetGuestRefusedEvent",
					    "An attempt the guest refused itself and reported "
					    "('guest_refused'): the guest's word, for the log only.",
					    guest_refused_fields, 6},
};

static PyObject *net_event_value(const sbx_module_state *st, const struct sbx_net_event *ev)
{
	PyObject *relay = PyLong_FromUnsignedLong(ev->relay);
	PyObject *stream = PyLong_FromUnsignedLong(ev->stream);
	switch (ev->kind) {
	case SBX_NET_EV_OPEN: {
		PyObject *items[] = {PyUnicode_FromString("open"), relay, stream,
				     PyUnicode_FromString(ev->text),
				     PyLong_FromUnsignedLong(ev->port)};
		return sbx_py_struct_new(st->net_event_types[SBX_PY_NET_OPEN_EVENT], 5, items);
	}
	case SBX_NET_EV_CONNECTED: {
		PyObject *items[] = {PyUnicode_FromString("connected"), relay, stream,
				     PyLong_FromUnsignedLong(ev->status)};
		return sbx_py_struct_new(st->net_event_types[SBX_PY_NET_CONNECTED_EVENT], 4, items);
	}
	case SBX_NET_EV_CLOSED: {
		PyObject *items[] = {PyUnicode_FromString("closed"), relay, stream,
				     PyLong_FromUnsignedLongLong(ev->bytes_to_guest),
				     PyLong_FromUnsignedLongLong(ev->bytes_from_guest),
				     PyBool_FromLong(ev->status != 0)};
		return sbx_py_struct_new(st->net_event_types[SBX_PY_NET_CLOSED_EVENT], 6, items);
	}
	case SBX_NET_EV_REFUSED: {
		PyObject *items[] = {PyUnicode_FromString("refused"), relay, stream,
				     PyUnicode_FromString(ev->text),
				     PyLong_FromUnsignedLong(ev->port),
				     PyLong_FromUnsignedLong(ev->status)};
		return sbx_py_struct_new(st->net_event_types[SBX_PY_NET_REFUSED_EVENT], 6, items);
	}
	case SBX_NET_EV_GUEST_REFUSED: {
		Py_XDECREF(stream);
		static const char *const what[] = {[SBX_NET_REFUSAL_NAME] = "name",
						   [SBX_NET_REFUSAL_ADDRESS] = "address",
						   [SBX_NET_REFUSAL_DROPPED] = "dropped"};
		PyObject *items[] = {PyUnicode_FromString("guest_refused"), relay,
				     PyUnicode_FromString(ev->status <= SBX_NET_REFUSAL_MAX
							      ? what[ev->status]
							      : "dropped"),
				     PyUnicode_FromString(ev->text),
				     PyLong_FromUnsignedLong(ev->port),
				     PyLong_FromUnsignedLongLong(ev->count)};
		return sbx_py_struct_new(st->net_event_types[SBX_PY_NET_GUEST_REFUSED_EVENT], 6,
					 items);
	}
	case SBX_NET_EV_VIOLATION:
	case SBX_NET_EV_PORT_CLOSED: {
		Py_XDECREF(stream);
		const char *kind = ev->kind == SBX_NET_EV_VIOLATION ? "violation" : "port_closed";
		/* "replace": the reason may quote guest bytes (it never should; the log must not
		 * fail on it). */
		PyObject *items[] = {PyUnicode_FromString(kind), relay,
				     PyUnicode_DecodeUTF8(ev->text, (Py_ssize_t)strlen(ev->text),
							  "replace")};
		return sbx_py_struct_new(st->net_event_types[SBX_PY_NET_RELAY_END_EVENT], 3, items);
	}
	}
	Py_XDECREF(relay);
	Py_XDECREF(stream);
	PyErr_SetString(PyExc_SystemError, "unknown network event kind");
	return NULL;
}

static PyObject *net_ring_run(NetRingObject *self, PyObject *unused)
{
	(void)unused;
	if (check_open(self) < 0)
		return NULL;
	const sbx_module_state *st = PyType_GetModuleState(Py_TYPE(self));
	if (!st)
		return NULL;
	struct sbx_err err = {0};
	int rc = sbx_net_ring_run(self->ring, &err);
	PyObject *list = PyList_New(0);
	if (!list)
		return NULL;
	struct sbx_net_event ev;
	while (sbx_net_ring_next_event(self->ring, &ev) == 1) {
		if (sbx_py_append_new(list, net_event_value(st, &ev)) < 0) {
			Py_DECREF(list);
			return NULL;
		}
	}
	if (rc < 0) {
		Py_DECREF(list);
		return sbx_raise_err(&err, NULL);
	}
	return list;
}

/* A CLOEXEC duplicate of fd, or -1 with OSError set. */
static int dup_fd(int fd)
{
	int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (copy < 0) {
		struct sbx_err err = {0};
		sbx_err_sys(&err, -errno, "fcntl(F_DUPFD_CLOEXEC)");
		sbx_raise_err(&err, NULL);
	}
	return copy;
}

static PyObject *net_ring_add_relay(NetRingObject *self, PyObject *arg)
{
	if (check_open(self) < 0)
		return NULL;
	int fd = PyObject_AsFileDescriptor(arg);
	if (fd < 0)
		return NULL;
	int copy = dup_fd(fd);
	if (copy < 0)
		return NULL;
	uint32_t relay;
	struct sbx_err err = {0};
	if (sbx_net_relay_add(self->ring, copy, &relay, &err) < 0) {
		close(copy);
		return sbx_raise_err(&err, NULL);
	}
	return PyLong_FromUnsignedLong(relay);
}

static PyObject *net_ring_close_relay(NetRingObject *self, PyObject *arg)
{
	if (check_open(self) < 0)
		return NULL;
	unsigned long relay = PyLong_AsUnsignedLong(arg);
	if (relay == (unsigned long)-1 && PyErr_Occurred())
		return NULL;
	struct sbx_err unknown = {0}; /* the one failure: no such relay, the False answer */
	return PyBool_FromLong(sbx_net_relay_close(self->ring, (uint32_t)relay, &unknown) == 0);
}

static PyObject *net_ring_open_reply(NetRingObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"relay", "stream", "status", "reason", "sock", NULL};
	unsigned relay, stream, status;
	const char *reason = "";
	Py_ssize_t reason_len = 0;
	PyObject *sock = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "III|s#O:open_reply", kwlist, &relay, &stream,
					 &status, &reason, &reason_len, &sock))
		return NULL;
	if (check_open(self) < 0)
		return NULL;
	int copy = -1;
	if (sock != Py_None) {
		int fd = PyObject_AsFileDescriptor(sock);
		if (fd < 0 || (copy = dup_fd(fd)) < 0)
			return NULL;
	}
	struct sbx_err err = {0};
	int rc = sbx_net_open_reply(self->ring, relay, stream, status, reason, (size_t)reason_len,
				    copy, &err);
	if (rc < 0 && rc != -ENOENT) /* ENOENT: the stream is gone, the False answer */
		return sbx_raise_err(&err, NULL);
	return PyBool_FromLong(rc == 0);
}

static PyObject *net_ring_connect(NetRingObject *self, PyObject *args)
{
	unsigned relay, port;
	PyObject *sock;
	if (!PyArg_ParseTuple(args, "IIO:connect", &relay, &port, &sock))
		return NULL;
	if (check_open(self) < 0)
		return NULL;
	int fd = PyObject_AsFileDescriptor(sock);
	int copy;
	if (fd < 0 || (copy = dup_fd(fd)) < 0)
		return NULL;
	uint32_t stream;
	struct sbx_err err = {0};
	if (sbx_net_connect(self->ring, relay, port, copy, &stream, &err) < 0)
		return sbx_raise_err(&err, NULL);
	return PyLong_FromUnsignedLong(stream);
}

static PyObject *net_ring_ingest(NetRingObject *self, PyObject *args)
{
	unsigned relay;
	Py_buffer data;
	if (!PyArg_ParseTuple(args, "Iy*:ingest", &relay, &data))
		return NULL;
	if (check_open(self) < 0) {
		PyBuffer_Release(&data);
		return NULL;
	}
	struct sbx_err err = {0};
	int rc = sbx_net_relay_ingest(self->ring, relay, data.buf, (size_t)data.len, &err);
	PyBuffer_Release(&data);
	if (rc < 0)
		return sbx_raise_err(&err, NULL);
	Py_RETURN_NONE;
}

static PyObject *net_ring_live(NetRingObject *self, PyObject *unused)
{
	(void)unused;
	if (check_open(self) < 0)
		return NULL;
	return PyLong_FromSize_t(sbx_net_ring_live(self->ring));
}

static PyObject *net_ring_enter(NetRingObject *self, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(self);
}

static PyObject *net_ring_exit(NetRingObject *self, PyObject *args)
{
	(void)args;
	return net_ring_close(self, NULL);
}

static PyObject *get_closed(NetRingObject *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->ring == NULL);
}

static PyMethodDef net_ring_methods[] = {
	{"fileno", (PyCFunction)net_ring_fileno, METH_NOARGS,
	 "fileno() -> int: the eventfd, readable when completions wait: call run() then"},
	{"run", (PyCFunction)net_ring_run, METH_NOARGS,
	 "run() -> list[NetEvent]: handle every completion; the events that resulted:\n"
	 "NetOpenEvent, NetConnectedEvent, NetClosedEvent, NetRefusedEvent,\n"
	 "NetGuestRefusedEvent, NetRelayEndEvent"},
	{"add_relay", (PyCFunction)net_ring_add_relay, METH_O,
	 "add_relay(port_fd) -> int: relay a VM's network port (the fd is duplicated)"},
	{"close_relay", (PyCFunction)net_ring_close_relay, METH_O,
	 "close_relay(relay) -> bool: reset its streams and forget it; False if unknown"},
	{"open_reply", (PyCFunction)(void (*)(void))net_ring_open_reply,
	 METH_VARARGS | METH_KEYWORDS,
	 "open_reply(relay, stream, status, reason='', sock=None) -> bool: answer an 'open'\n"
	 "event; status 0 with the connected socket, else a refusal; False if the stream is gone"},
	{"connect", (PyCFunction)net_ring_connect, METH_VARARGS,
	 "connect(relay, guest_port, sock) -> int: a stream to 127.0.0.1:guest_port in the guest\n"
	 "for an accepted socket; OSError(EBUSY) when the VM has the most streams"},
	{"ingest", (PyCFunction)net_ring_ingest, METH_VARARGS,
	 "ingest(relay, data): tests only: handle data as if the port had given it"},
	{"live", (PyCFunction)net_ring_live, METH_NOARGS,
	 "live() -> int: relays and streams not yet freed"},
	{"close", (PyCFunction)net_ring_close, METH_NOARGS, "close(): close every relay and socket"},
	{"__enter__", (PyCFunction)net_ring_enter, METH_NOARGS, NULL},
	{"__exit__", (PyCFunction)net_ring_exit, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef net_ring_getset[] = {
	{"closed", (getter)get_closed, NULL, "True once close() was called", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(net_ring_doc,
	     "NetRing(*, entries=1024)\n\n"
	     "One io_uring that relays the network streams of many VMs (net_relay.h). Register\n"
	     "fileno() on the event loop and call run() when it is readable.");

static PyType_Slot net_ring_slots[] = {
	{Py_tp_new, (void *)net_ring_new},
	{Py_tp_dealloc, (void *)net_ring_dealloc},
	{Py_tp_methods, net_ring_methods},
	{Py_tp_getset, net_ring_getset},
	{Py_tp_doc, (void *)net_ring_doc},
	{0, NULL},
};

static PyType_Spec net_ring_spec = {
	.name = "exec_sandbox._execsbx.NetRing",
	.basicsize = sizeof(NetRingObject),
	.itemsize = 0,
	.flags = SBX_PY_TYPE_FLAGS,
	.slots = net_ring_slots,
};

int sbx_py_net_ring_type_add(PyObject *module, sbx_module_state *st)
{
	if (sbx_py_add_struct_types(module, net_event_descs, SBX_PY_NET_EVENT_TYPES,
				    st->net_event_types) < 0)
		return -1;
	return sbx_py_add_type(module, &net_ring_spec, &st->net_ring_type);
}
