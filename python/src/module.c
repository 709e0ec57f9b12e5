/* The module: process state, errors, module functions and PyInit. */
#include "binding.h"

/* ------------------------------------------------------------------------- */
/* Process state                                                              */

static int g_shutdown = 0; /* set by _shutdown() (registered with atexit) */

int shutting_down(void) { return __atomic_load_n(&g_shutdown, __ATOMIC_ACQUIRE); }

PyObject* g_registry = NULL;
PyObject* g_resolver = NULL;

PyObject* s_dtype;
PyObject* s_shape;
PyObject* s_get_device;
PyObject* s_is_contiguous;
PyObject* s_data_ptr;
PyObject* s_nbytes;
PyObject* s_clone;
PyObject* s_view;
PyObject* s_cuda_stream;

/* ------------------------------------------------------------------------- */
/* Errors                                                                     */

PyObject* raise_dps(dpsResult_t r) {
  const char* msg = dpsGetLastError();
  PyObject* exc = r == dpsInvalidArgument ? PyExc_ValueError : PyExc_RuntimeError;
  PyErr_Format(exc, "%s [%s]", (msg != NULL && msg[0] != '\0') ? msg : "dpsampling call failed",
               dpsGetErrorString(r));
  return NULL;
}

PyObject* err_take(void) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (t == NULL) return NULL;
  PyErr_NormalizeException(&t, &v, &tb);
  if (v != NULL && tb != NULL) PyException_SetTraceback(v, tb);
  Py_XDECREF(t);
  Py_XDECREF(tb);
  return v;
#endif
}

void err_give(PyObject* e) { /* steals e */
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(e);
#else
  PyObject* t = (PyObject*)Py_TYPE(e);
  Py_INCREF(t);
  PyErr_Restore(t, e, PyException_GetTraceback(e));
#endif
}

/* ------------------------------------------------------------------------- */
/* Module functions                                                           */

static PyObject* m_get_unique_id(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  dpsUniqueId id;
  dpsResult_t r;
  Py_BEGIN_ALLOW_THREADS;
  r = dpsGetUniqueId(&id);
  Py_END_ALLOW_THREADS;
  if (r != dpsSuccess) return raise_dps(r);
  return PyBytes_FromStringAndSize(id.internal, sizeof id.internal);
}

static PyObject* m_config_check(PyObject* m, PyObject* args) {
  (void)m;
  dpsConfig_t cfg = DPS_CONFIG_INITIALIZER;
  long long vocab;
  int dtype, backend;
  if (!PyArg_ParseTuple(args, "iiiiLii|i:config_check", &cfg.tp_size, &cfg.rank, &cfg.max_pad_bs,
                        &cfg.num_tokens_per_req, &vocab, &dtype, &backend, &cfg.timeout_ms))
    return NULL;
  cfg.vocab_size = (int64_t)vocab;
  cfg.logits_dtype = (dpsDataType_t)dtype;
  cfg.backend = (dpsBackend_t)backend;
  dpsResult_t r = dpsConfigCheck(&cfg);
  if (r != dpsSuccess) return raise_dps(r);
  Py_RETURN_NONE;
}

static PyObject* m_parse_backend(PyObject* m, PyObject* arg) {
  (void)m;
  if (!PyUnicode_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "backend must be a str ('auto', 'nccl' or 'onesided'), got %R", arg);
    return NULL;
  }
  const char* s = PyUnicode_AsUTF8(arg);
  if (s == NULL) return NULL;
  dpsBackend_t b;
  dpsResult_t r = dpsParseBackend(s, &b);
  if (r != dpsSuccess) return raise_dps(r);
  return PyLong_FromLong((long)b);
}

static PyObject* m_backend_name(PyObject* m, PyObject* arg) {
  (void)m;
  long v = PyLong_AsLong(arg);
  if (v == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(dpsBackendName((dpsBackend_t)v));
}

/* resolve_backend(requested: str, onesided_available: bool) -> str */
static PyObject* m_resolve_backend(PyObject* m, PyObject* args) {
  (void)m;
  const char* req;
  int avail;
  if (!PyArg_ParseTuple(args, "sp:resolve_backend", &req, &avail)) return NULL;
  dpsBackend_t b, out;
  dpsResult_t r = dpsParseBackend(req, &b);
  if (r == dpsSuccess) r = dpsResolveBackend(b, avail, &out);
  if (r != dpsSuccess) return raise_dps(r);
  return PyUnicode_FromString(dpsBackendName(out));
}

static PyObject* m_onesided_on_devices(PyObject* m, PyObject* arg) {
  (void)m;
  PyObject* seq = PySequence_Fast(arg, "devices must be a sequence of ints");
  if (seq == NULL) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int* devs = (int*)PyMem_Malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  if (devs == NULL) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      PyMem_Free(devs);
      Py_DECREF(seq);
      return NULL;
    }
    if (v < 0 || v > INT32_MAX) {
      PyErr_Format(PyExc_ValueError, "cuda_devices[%zd]=%ld is not a device ordinal", i, v);
      PyMem_Free(devs);
      Py_DECREF(seq);
      return NULL;
    }
    devs[i] = (int)v;
  }
  Py_DECREF(seq);
  int avail = 0;
  dpsResult_t r;
  Py_BEGIN_ALLOW_THREADS;
  r = dpsOnesidedAvailableOnDevices(devs, (int)n, &avail);
  Py_END_ALLOW_THREADS;
  PyMem_Free(devs);
  if (r != dpsSuccess) return raise_dps(r);
  return PyBool_FromLong(avail);
}

static PyObject* m_version(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  int v = 0;
  dpsResult_t r = dpsGetVersion(&v);
  if (r != dpsSuccess) return raise_dps(r);
  return PyLong_FromLong(v);
}

static PyObject* m_nccl_version(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  int v = 0;
  ncclResult_t r = ncclGetVersion(&v);
  if (r != ncclSuccess) {
    PyErr_Format(PyExc_RuntimeError, "ncclGetVersion failed: %s", ncclGetErrorString(r));
    return NULL;
  }
  return PyLong_FromLong(v);
}

static PyObject* m_dtype_code(PyObject* m, PyObject* args) {
  (void)m;
  PyObject* o;
  const char* name = "logits_dtype";
  int allow_none = 1;
  if (!PyArg_ParseTuple(args, "O|sp:dtype_code", &o, &name, &allow_none)) return NULL;
  int c = dtype_code_of(o, allow_none, name);
  if (c == -2) return NULL;
  return PyLong_FromLong(c);
}

/* _test_host_capsule(rows, cols) -> "dltensor" capsule of a host float32
 * [rows, cols] (cols == 0: int32 [rows]) holding 0, 1, 2, ...: checks the DLPack
 * ABI and the deleter with any CPU DLPack consumer (numpy, torch) in CI. */
static PyObject* m_test_host_capsule(PyObject* m, PyObject* args) {
  (void)m;
  long long rows, cols;
  if (!PyArg_ParseTuple(args, "LL:_test_host_capsule", &rows, &cols)) return NULL;
  if (rows < 1 || cols < 0 || rows > (1 << 20) || cols > (1 << 20)) {
    PyErr_SetString(PyExc_ValueError, "_test_host_capsule: bad shape");
    return NULL;
  }
  int64_t count = cols > 0 ? rows * cols : rows;
  void* buf = malloc((size_t)count * 4);
  if (buf == NULL) return PyErr_NoMemory();
  for (int64_t i = 0; i < count; ++i) {
    if (cols > 0) ((float*)buf)[i] = (float)i;
    else ((int32_t*)buf)[i] = (int32_t)i;
  }
  int64_t shape[2] = {rows, cols};
  return make_capsule(NULL, buf, buf, kDLCPU, 0, g_dtypes[cols > 0 ? DT_F32 : DT_I32].dl, cols > 0 ? 2 : 1,
                      shape);
}

static PyObject* m_test_host_deleted(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  return PyLong_FromLong(__atomic_load_n(&g_test_deleted, __ATOMIC_RELAXED));
}

static PyObject* m_shutdown(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  __atomic_store_n(&g_shutdown, 1, __ATOMIC_RELEASE);
  (void)dpsReleasePending(NULL);
  Py_RETURN_NONE;
}

static PyObject* m_release_pending(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  int left = 0;
  dpsResult_t r;
  Py_BEGIN_ALLOW_THREADS;
  r = dpsReleasePending(&left);
  Py_END_ALLOW_THREADS;
  if (r != dpsSuccess) return raise_dps(r);
  return PyLong_FromLong(left);
}

static PyObject* m_set_group_registry(PyObject* m, PyObject* args) {
  (void)m;
  PyObject *reg, *resolver;
  if (!PyArg_ParseTuple(args, "O!O:_set_group_registry", &PyDict_Type, &reg, &resolver)) return NULL;
  if (!PyCallable_Check(resolver)) {
    PyErr_SetString(PyExc_TypeError, "resolver must be callable");
    return NULL;
  }
  Py_INCREF(reg);
  Py_INCREF(resolver);
  Py_XSETREF(g_registry, reg);
  Py_XSETREF(g_resolver, resolver);
  Py_RETURN_NONE;
}

PyObject* g_arg_helpers = NULL; /* dict name -> callable, from _set_arg_helpers */

static PyObject* m_set_arg_helpers(PyObject* m, PyObject* arg) {
  (void)m;
  if (!PyDict_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "_set_arg_helpers takes a dict of callables");
    return NULL;
  }
  Py_INCREF(arg);
  Py_XSETREF(g_arg_helpers, arg);
  Py_RETURN_NONE;
}

PyObject* arg_helper(const char* name) {
  PyObject* f = g_arg_helpers != NULL ? PyDict_GetItemString(g_arg_helpers, name) : NULL;
  if (f == NULL)
    PyErr_Format(PyExc_RuntimeError,
                 "dpsampling: the argument helper '%s' is not registered (import dpsampling, "
                 "which registers it, instead of using the extension alone)",
                 name);
  return f;
}

static PyObject* m_last_error(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  return PyUnicode_FromString(dpsGetLastError());
}

static PyMethodDef module_methods[] = {
    {"get_unique_id", m_get_unique_id, METH_NOARGS,
     "get_unique_id($module, /)\n--\n\ndpsGetUniqueId() -> 128 bytes"},
    {"config_check", m_config_check, METH_VARARGS,
     "config_check($module, tp_size, rank, max_pad_bs, num_tokens_per_req, vocab_size, dtype,\n"
     "             backend, timeout_ms=0, /)\n--\n\n"
     "dpsConfigCheck; ValueError on a bad configuration (no GPU needed)."},
    {"parse_backend", m_parse_backend, METH_O,
     "parse_backend($module, name, /)\n--\n\ndpsParseBackend(name) -> code"},
    {"backend_name", m_backend_name, METH_O,
     "backend_name($module, code, /)\n--\n\ndpsBackendName(code) -> name"},
    {"resolve_backend", m_resolve_backend, METH_VARARGS,
     "resolve_backend($module, requested, onesided_available, /)\n--\n\n"
     "-> 'nccl' | 'onesided' (dpsResolveBackend, with the environment overrides)"},
    {"onesided_available_on_devices", m_onesided_on_devices, METH_O,
     "onesided_available_on_devices($module, devices, /)\n--\n\n"
     "dpsOnesidedAvailableOnDevices(devices) -> bool"},
    {"_tensor_fast_path", (PyCFunction)(void (*)(void))tensor_fast_path, METH_FASTCALL,
     "_tensor_fast_path($module, enable=None, /)\n--\n\n"
     "-> (in use, (major, minor) or None): whether tensor arguments are read\n"
     "through torch's DLPack C exchange API (tensors and the current stream);\n"
     "enable turns that on or off."},
    {"_current_stream", m_current_stream, METH_O,
     "_current_stream($module, device, /)\n--\n\n"
     "-> the stream (an int) the operations would be queued on now"},
    {"version", m_version, METH_NOARGS,
     "version($module, /)\n--\n\nDPS_VERSION_CODE of the linked library"},
    {"nccl_version", m_nccl_version, METH_NOARGS,
     "nccl_version($module, /)\n--\n\nncclGetVersion() of the NCCL actually loaded (e.g. 22809)"},
    {"dtype_code", m_dtype_code, METH_VARARGS,
     "dtype_code($module, obj, name='logits_dtype', allow_none=True, /)\n--\n\n"
     "-> dpsDataType_t code; TypeError for an unsupported dtype"},
    {"last_error", m_last_error, METH_NOARGS, "last_error($module, /)\n--\n\ndpsGetLastError()"},
    {"_test_host_capsule", m_test_host_capsule, METH_VARARGS, NULL},
    {"_test_host_deleted", m_test_host_deleted, METH_NOARGS, NULL},
    {"_shutdown", m_shutdown, METH_NOARGS, "interpreter exit: free what is released, warn no more"},
    {"release_pending", m_release_pending, METH_NOARGS,
     "release_pending($module, /)\n--\n\nFree the buffers of every released communicator whose "
     "work has finished (dpsReleasePending); returns how many still wait. Call it outside CUDA "
     "graph capture on this thread."},
    {"_set_group_registry", m_set_group_registry, METH_VARARGS, NULL},
    {"_set_arg_helpers", m_set_arg_helpers, METH_O, NULL},
    KW_METHOD("_test_sample_args", m_test_sample_args, NULL),
    KW_METHOD("_test_verify_args", m_test_verify_args, NULL),
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_dpsampling",
                                       "CPython binding of libdpsampling", -1, module_methods,
                                       NULL, NULL, NULL, NULL};

#define INTERN(var, str)                                  \
  do {                                                    \
    if ((var = PyUnicode_InternFromString(str)) == NULL) \
      return NULL;                                        \
  } while (0)

#define ADD_INT(m, name, v)                                 \
  do {                                                      \
    if (PyModule_AddIntConstant(m, name, (long)(v)) != 0) { \
      Py_DECREF(m);                                         \
      return NULL;                                          \
    }                                                       \
  } while (0)

PyMODINIT_FUNC PyInit__dpsampling(void) {
  INTERN(s_dtype, "dtype");
  INTERN(s_shape, "shape");
  INTERN(s_get_device, "get_device");
  INTERN(s_is_contiguous, "is_contiguous");
  INTERN(s_data_ptr, "data_ptr");
  INTERN(s_nbytes, "nbytes");
  INTERN(s_clone, "clone");
  INTERN(s_view, "view");
  INTERN(s_cuda_stream, "cuda_stream");
  if (PyType_Ready(&NcclGroupType) < 0 || PyType_Ready(&CommType) < 0 ||
      PyType_Ready(&BackendType) < 0)
    return NULL;
  PyObject* m = PyModule_Create(&moduledef);
  if (m == NULL) return NULL;
  Py_INCREF(&NcclGroupType);
  Py_INCREF(&CommType);
  if (PyModule_AddObject(m, "NcclGroup", (PyObject*)&NcclGroupType) != 0 ||
      PyModule_AddObject(m, "Comm", (PyObject*)&CommType) != 0) {
    Py_DECREF(m);
    return NULL;
  }
  PyObject* gb = PyObject_New(PyObject, &BackendType);
  if (gb == NULL || PyModule_AddObject(m, "global_backend", gb) != 0) {
    Py_XDECREF(gb);
    Py_DECREF(m);
    return NULL;
  }
  ADD_INT(m, "DTYPE_UNSET", dpsDtypeUnset);
  ADD_INT(m, "FLOAT32", dpsFloat32);
  ADD_INT(m, "BFLOAT16", dpsBfloat16);
  ADD_INT(m, "FLOAT16", dpsFloat16);
  ADD_INT(m, "BACKEND_AUTO", dpsBackendAuto);
  ADD_INT(m, "BACKEND_NCCL", dpsBackendNccl);
  ADD_INT(m, "BACKEND_ONESIDED", dpsBackendOnesided);
  ADD_INT(m, "UNIQUE_ID_BYTES", sizeof(dpsUniqueId));
  ADD_INT(m, "SHARD_MAX_RANKS", DPS_SHARD_MAX_RANKS);
  ADD_INT(m, "HEADER_VERSION", DPS_VERSION_CODE);
  ADD_INT(m, "NCCL_HEADER_VERSION", NCCL_VERSION_CODE);
  return m;
}
