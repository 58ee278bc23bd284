/* Vm.send_*() and Vm.flush() (py_requests.c), with their docstrings for the Vm type's method
 * table (py_vm.c). */
#ifndef SBX_PY_REQUESTS_H
#define SBX_PY_REQUESTS_H

#include "py_common.h"

#include "vm.h"

extern const char sbx_py_send_exec_doc[], sbx_py_send_ping_doc[], sbx_py_send_prestart_doc[],
	sbx_py_send_reseed_doc[], sbx_py_flush_doc[];
extern const char sbx_py_send_file_write_begin_doc[], sbx_py_send_file_write_data_doc[],
	sbx_py_send_file_write_end_doc[], sbx_py_send_file_read_doc[], sbx_py_send_file_list_doc[];

PyObject *sbx_py_send_exec(struct sbx_vm *vm, PyObject *args, PyObject *kwds);
PyObject *sbx_py_send_ping(struct sbx_vm *vm, PyObject *o_id);
PyObject *sbx_py_send_prestart(struct sbx_vm *vm, PyObject *args);
PyObject *sbx_py_send_reseed(struct sbx_vm *vm, PyObject *args);
PyObject *sbx_py_send_file_write_begin(struct sbx_vm *vm, PyObject *args);
PyObject *sbx_py_send_file_write_data(struct sbx_vm *vm, PyObject *args);
PyObject *sbx_py_send_file_write_end(struct sbx_vm *vm, PyObject *args);
PyObject *sbx_py_send_file_read(struct sbx_vm *vm, PyObject *args);
extern const char sbx_py_send_net_config_doc[];
PyObject *sbx_py_send_net_config(struct sbx_vm *vm, PyObject *args, PyObject *kwds);
PyObject *sbx_py_send_file_list(struct sbx_vm *vm, PyObject *args);
extern const char sbx_py_send_tool_result_doc[];
PyObject *sbx_py_send_tool_result(struct sbx_vm *vm, PyObject *args);

extern const char sbx_py_send_proc_spawn_doc[];
PyObject *sbx_py_send_proc_spawn(struct sbx_vm *vm, PyObject *args, PyObject *kwds);
extern const char sbx_py_send_proc_read_doc[];
PyObject *sbx_py_send_proc_read(struct sbx_vm *vm, PyObject *args);
extern const char sbx_py_send_proc_write_doc[];
PyObject *sbx_py_send_proc_write(struct sbx_vm *vm, PyObject *args, PyObject *kwds);
extern const char sbx_py_send_proc_signal_doc[];
PyObject *sbx_py_send_proc_signal(struct sbx_vm *vm, PyObject *args);
extern const char sbx_py_send_proc_wait_doc[];
PyObject *sbx_py_send_proc_wait(struct sbx_vm *vm, PyObject *args);
extern const char sbx_py_send_proc_list_doc[];
PyObject *sbx_py_send_proc_list(struct sbx_vm *vm, PyObject *o_id);
extern const char sbx_py_send_proc_resize_doc[];
PyObject *sbx_py_send_proc_resize(struct sbx_vm *vm, PyObject *args);
PyObject *sbx_py_flush(struct sbx_vm *vm);

#endif /* SBX_PY_REQUESTS_H */
