/* Collectives between Python and the library: a Python fallback_comm_backend
 * as the communicator's dpsCollectives_t, and the library's default NCCL
 * collectives as a Python object (global_backend). */
#include "binding.h"

/* ------------------------------------------------------------------------- */
/* Python collectives (fallback_comm_backend) as a dpsCollectives_t           */

void adapter_free(Adapter* a) {
  if (a == NULL) return;
  Py_XDECREF(a->backend);
  Py_XDECREF(a->group);
  Py_XDECREF(a->exc);
  free(a);
}

static dpsResult_t adapter_invoke(Adapter* a, const char* method, const void* send,
                                  int64_t send_bytes, void* recv, int64_t recv_bytes) {
  PyGILState_STATE gs = PyGILState_Ensure();
  dpsResult_t res = dpsSuccess;
  PyObject *in = NULL, *out = NULL, *fn = NULL, *args = NULL, *ret = NULL;
  in = make_tensor(a->owner, (void*)send, a->device, g_dtypes[DT_U8].dl, 1, &send_bytes);
  if (in != NULL) out = make_tensor(a->owner, recv, a->device, g_dtypes[DT_U8].dl, 1, &recv_bytes);
  if (out != NULL) fn = PyObject_GetAttrString(a->backend, method);
  /* (output, input, group) by position, as the upstream component calls its
   * collectives: the object's own parameter names do not matter */
  if (fn != NULL) args = PyTuple_Pack(3, out, in, a->group);
  if (args != NULL) ret = PyObject_Call(fn, args, NULL);
  if (ret == NULL) {
    if (a->exc == NULL) a->exc = err_take();
    else PyErr_Clear();
    res = dpsInternalError;
  }
  Py_XDECREF(ret);
  Py_XDECREF(args);
  Py_XDECREF(fn);
  Py_XDECREF(out);
  Py_XDECREF(in);
  PyGILState_Release(gs);
  return res;
}

dpsResult_t adapter_all_gather(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                               struct CUstream_st* stream) {
  (void)stream; /* == torch's current stream: the op was called with it */
  Adapter* a = (Adapter*)ctx;
  return adapter_invoke(a, "all_gather_into_tensor", sendbuf, (int64_t)bytes, recvbuf,
                        (int64_t)bytes * a->tp);
}

dpsResult_t adapter_all_to_all(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                               struct CUstream_st* stream) {
  (void)stream;
  Adapter* a = (Adapter*)ctx;
  return adapter_invoke(a, "all_to_all_single", sendbuf, (int64_t)bytes * a->tp, recvbuf,
                        (int64_t)bytes * a->tp);
}

/* ------------------------------------------------------------------------- */
/* The library's default collectives object (get_global_backend())           */

static PyObject* backend_collective(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                                    int all_to_all) {
  static const char* const names[] = {"output", "input", "group", NULL};
  PyObject* a[3];
  if (fast_args(all_to_all ? "all_to_all_single" : "all_gather_into_tensor", names, 2, args,
                nargs, kwnames, a) != 0)
    return NULL;
  PyObject *out = a[0], *in = a[1];
  PyObject* group = a[2] != NULL ? a[2] : Py_None;
  if (torch_load() != 0) return NULL;
  NcclGroupObject* g = lookup_group(group);
  if (g == NULL) return NULL;
  SharedNccl* s = g->s;
  shared_nccl_retain(s);
  Py_DECREF(g);
  PyObject* ret = NULL;
  TArg to, ti;
  if (tensor_arg(out, "output", s->device, 0, -1, 1, &to) != 0 ||
      tensor_arg(in, "input", s->device, 0, -1, 1, &ti) != 0)
    goto done;
  if (all_to_all ? (to.nbytes != ti.nbytes || ti.nbytes % s->nranks != 0)
                 : (to.nbytes != ti.nbytes * s->nranks)) {
    PyErr_Format(PyExc_ValueError,
                 "%s: output has %lld bytes and input %lld bytes; the group has %d ranks",
                 all_to_all ? "all_to_all_single" : "all_gather_into_tensor",
                 (long long)to.nbytes, (long long)ti.nbytes, s->nranks);
    goto done;
  }
  void* stream;
  if (current_stream(s->device, &stream) != 0) goto done;
  /* The library's own loops (dpsNcclAllGatherBytes / dpsNcclAllToAllBytes);
   * bytes == 0 enqueues nothing. */
  dpsResult_t r = dpsSuccess;
  cudaError_t ce;
  Py_BEGIN_ALLOW_THREADS;
  DevGuard dg;
  ce = dev_enter(&dg, s->device);
  if (ce == cudaSuccess) {
    struct CUstream_st* st = (struct CUstream_st*)stream;
    if (all_to_all)
      r = dpsNcclAllToAllBytes(s->comm, ti.ptr, to.ptr, (size_t)ti.nbytes / (size_t)s->nranks, st);
    else
      r = dpsNcclAllGatherBytes(s->comm, ti.ptr, to.ptr, (size_t)ti.nbytes, st);
    dev_leave(&dg);
  }
  Py_END_ALLOW_THREADS;
  if (ce != cudaSuccess) {
    PyErr_Format(PyExc_RuntimeError, "cudaSetDevice(%d) failed: %s", s->device, cudaGetErrorString(ce));
    goto done;
  }
  if (r != dpsSuccess) {
    raise_dps(r);
    goto done;
  }
  ret = Py_None;
  Py_INCREF(ret);
done:
  shared_nccl_release(s);
  return ret;
}

static PyObject* backend_all_gather(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                    PyObject* kw) {
  (void)self;
  return backend_collective(args, nargs, kw, 0);
}

static PyObject* backend_all_to_all(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                    PyObject* kw) {
  (void)self;
  return backend_collective(args, nargs, kw, 1);
}

static PyObject* backend_repr(PyObject* self) {
  (void)self;
  return PyUnicode_FromString("<dpsampling NCCL collectives (library default)>");
}

static PyMethodDef backend_methods[] = {
    KW_METHOD("all_gather_into_tensor", backend_all_gather,
              "all_gather_into_tensor($self, /, output, input, group=None)\n--\n\n"
              "NCCL all-gather of the bytes of input into output on the group's communicator, "
              "on torch's current stream."),
    KW_METHOD("all_to_all_single", backend_all_to_all,
              "all_to_all_single($self, /, output, input, group=None)\n--\n\n"
              "Equal-split NCCL all-to-all of bytes."),
    {NULL, NULL, 0, NULL}};

PyTypeObject BackendType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dpsampling._dpsampling.NcclCollectives",
    .tp_basicsize = sizeof(BackendObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The library's default collectives (NCCL on the group's shared communicator).",
    .tp_repr = backend_repr,
    .tp_methods = backend_methods,
};
