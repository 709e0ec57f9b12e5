/* dpsampling._dpsampling: the CPython binding of libdpsampling.
 *
 * CPython C API only; torch is neither a build nor an import dependency: it is
 * imported lazily, the first time a tensor crosses the boundary. Tensors come
 * in through data_ptr()/shape/dtype/get_device()/is_contiguous() and go out
 * as torch tensors that alias the communicator's persistent device buffers
 * (DLPack "dltensor" capsules handed to torch's from_dlpack; no copies).
 *
 * Ownership:
 *   SharedNccl  refcounted C struct around one ncclComm_t (one per group, made
 *               by NcclGroup, shared by every communicator of that group).
 *   Handle      refcounted C struct around one dpsComm_t; it holds a reference
 *               to its SharedNccl. The Comm object holds one reference and
 *               every DLPack tensor it hands out holds one, so a tensor stays
 *               valid after the Comm object is gone. The references are plain
 *               atomics: a DLPack deleter may run on any thread without the GIL.
 * At interpreter shutdown (atexit) destruction is skipped (the process is
 * going away; NCCL/CUDA teardown from finalizers can hang on absent peers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dpsampling.h"

/* ------------------------------------------------------------------------- */
/* The public DLPack ABI (v0.x "dltensor" capsules), written out here so that
 * the extension needs no DLPack or torch headers; layouts as in
 * https://github.com/dmlc/dlpack/blob/main/include/dlpack/dlpack.h (enums are
 * 4-byte C ints). */

enum { kDLCPU = 1, kDLCUDA = 2 };                      /* DLDeviceType */
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 }; /* DLDataTypeCode */

typedef struct {
  int32_t device_type; /* DLDeviceType */
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; may be NULL for compact row-major */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

#define DPS_DLPACK_CAPSULE_NAME "dltensor"
#define DPS_DLPACK_USED_CAPSULE_NAME "used_dltensor"


/* ------------------------------------------------------------------------- */
/* Process state                                                              */

static int g_shutdown = 0; /* set by _shutdown() (registered with atexit) */

static int shutting_down(void) { return __atomic_load_n(&g_shutdown, __ATOMIC_ACQUIRE); }

/* torch, loaded on first use */
static int t_ready = 0;
static PyObject* t_from_dlpack = NULL;     /* torch._C._from_dlpack */
static PyObject* t_raw_stream = NULL;      /* torch._C._cuda_getCurrentRawStream, or NULL */
static PyObject* t_current_stream = NULL;  /* torch.cuda.current_stream (fallback) */
static PyObject* t_f32 = NULL;
static PyObject* t_bf16 = NULL;
static PyObject* t_f16 = NULL;
static PyObject* t_i32 = NULL;
static PyObject* t_u8 = NULL;

/* group registry of the Python layer: dict tuple -> NcclGroup, and a callable
 * group -> NcclGroup that bootstraps on a miss */
static PyObject* g_registry = NULL;
static PyObject* g_resolver = NULL;

/* interned names */
static PyObject* s_dtype;
static PyObject* s_shape;
static PyObject* s_get_device;
static PyObject* s_is_contiguous;
static PyObject* s_data_ptr;
static PyObject* s_nbytes;
static PyObject* s_clone;
static PyObject* s_cuda_stream;

#define DPS_TORCH_MISSING                                                                  \
  "dpsampling needs PyTorch for tensors and communicators, and it is not installed: "    \
  "pip install 'dpsampling[torch]' (or a CUDA 13 build of torch, e.g. "                  \
  "pip install torch --index-url https://download.pytorch.org/whl/cu130)"

static int torch_load(void) {
  if (t_ready) return 0;
  PyObject* torch = PyImport_ImportModule("torch");
  if (torch == NULL) {
    if (PyErr_ExceptionMatches(PyExc_ModuleNotFoundError)) {
      PyErr_Clear();
      PyErr_SetString(PyExc_ModuleNotFoundError, DPS_TORCH_MISSING);
    }
    return -1;
  }
  int rc = -1;
  PyObject* C = PyObject_GetAttrString(torch, "_C");
  if (C == NULL) goto out;
  t_from_dlpack = PyObject_GetAttrString(C, "_from_dlpack");
  if (t_from_dlpack == NULL) {
    PyErr_Clear();
    t_from_dlpack = PyObject_GetAttrString(torch, "from_dlpack");
    if (t_from_dlpack == NULL) goto out;
  }
  t_raw_stream = PyObject_GetAttrString(C, "_cuda_getCurrentRawStream");
  if (t_raw_stream == NULL) {
    PyErr_Clear();
    PyObject* cuda = PyObject_GetAttrString(torch, "cuda");
    if (cuda == NULL) goto out;
    t_current_stream = PyObject_GetAttrString(cuda, "current_stream");
    Py_DECREF(cuda);
    if (t_current_stream == NULL) goto out;
  }
  if ((t_f32 = PyObject_GetAttrString(torch, "float32")) == NULL) goto out;
  if ((t_bf16 = PyObject_GetAttrString(torch, "bfloat16")) == NULL) goto out;
  if ((t_f16 = PyObject_GetAttrString(torch, "float16")) == NULL) goto out;
  if ((t_i32 = PyObject_GetAttrString(torch, "int32")) == NULL) goto out;
  if ((t_u8 = PyObject_GetAttrString(torch, "uint8")) == NULL) goto out;
  t_ready = 1;
  rc = 0;
out:
  Py_XDECREF(C);
  Py_DECREF(torch);
  return rc;
}

/* torch's current stream on `device` (works inside CUDA graph capture). */
static int current_stream(int device, void** stream) {
  PyObject* r;
  if (t_raw_stream != NULL) {
    r = PyObject_CallFunction(t_raw_stream, "i", device);
  } else {
    PyObject* s = PyObject_CallFunction(t_current_stream, "i", device);
    if (s == NULL) return -1;
    r = PyObject_GetAttr(s, s_cuda_stream);
    Py_DECREF(s);
  }
  if (r == NULL) return -1;
  void* p = PyLong_AsVoidPtr(r);
  Py_DECREF(r);
  if (p == NULL && PyErr_Occurred()) return -1;
  *stream = p;
  return 0;
}

/* ------------------------------------------------------------------------- */
/* Errors                                                                     */

/* dpsInvalidArgument -> ValueError; everything else -> RuntimeError. */
static PyObject* raise_dps(dpsResult_t r) {
  const char* msg = dpsGetLastError();
  PyObject* exc = r == dpsInvalidArgument ? PyExc_ValueError : PyExc_RuntimeError;
  PyErr_Format(exc, "%s [%s]", (msg != NULL && msg[0] != '\0') ? msg : "dpsampling call failed",
               dpsGetErrorString(r));
  return NULL;
}

/* The current exception as one object (cleared), and back. */
static PyObject* err_take(void) {
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

static void err_give(PyObject* e) { /* steals e */
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(e);
#else
  PyObject* t = (PyObject*)Py_TYPE(e);
  Py_INCREF(t);
  PyErr_Restore(t, e, PyException_GetTraceback(e));
#endif
}

/* ------------------------------------------------------------------------- */
/* Refcounted C objects                                                       */

/* Teardown. The collective step (dpsCommClose, ncclCommDestroy of a group's
 * communicator) runs only from an explicit call: close() and
 * destroy_group_communicators(). It runs without the GIL, since when one
 * process drives several ranks from threads, a rank's thread that held the
 * GIL there would keep the other ranks' threads from reaching the same
 * collective. The last release of a handle (close, dealloc, or a DLPack
 * deleter, with or without the GIL, possibly while some stream captures a
 * CUDA graph) only calls dpsCommRelease, which makes no CUDA or NCCL call:
 * the frees wait for the library's next safe point. */
typedef struct {
  long refs;
  ncclComm_t comm;      /* NULL once destroyed (NcclGroup.destroy) */
  int device, nranks, rank;
  long open_users;      /* communicators created on it and not closed */
} SharedNccl;

static void shared_nccl_retain(SharedNccl* s) { __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED); }

/* Never destroys the NCCL communicator (that is collective: NcclGroup.destroy,
 * called by destroy_group_communicators); a group dropped without it keeps
 * its communicator until the process exits. */
static void shared_nccl_release(SharedNccl* s) {
  if (s == NULL) return;
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  free(s);
}

typedef struct {
  long refs;
  dpsComm_t comm;
  SharedNccl* nccl;
  int open; /* counted in nccl->open_users */
} Handle;

static void handle_retain(Handle* h) { __atomic_add_fetch(&h->refs, 1, __ATOMIC_RELAXED); }

static void gil_take(PyThreadState* ts) {
  if (ts != NULL) PyEval_RestoreThread(ts);
}

/* The communicator is no longer usable through this handle (closed, or its
 * Comm object is gone): the group may be destroyed as far as it goes. */
static void handle_unuse(Handle* h) {
  if (h != NULL && h->open) {
    h->open = 0;
    __atomic_sub_fetch(&h->nccl->open_users, 1, __ATOMIC_ACQ_REL);
  }
}

/* Every holder other than the Comm object's own reference is a DLPack tensor
 * or a call in progress (comm_enter). The last one queues the communicator
 * for release: no CUDA or NCCL call, safe inside any capture and on any
 * thread. */
static void handle_release(Handle* h) {
  if (h == NULL) return;
  if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  (void)dpsCommRelease(h->comm);
  shared_nccl_release(h->nccl);
  free(h);
}

/* ------------------------------------------------------------------------- */
/* DLPack out                                                                 */

typedef struct {
  DLManagedTensor m;
  int64_t shape[2];
  int64_t strides[2];
  Handle* owner;  /* device views: the communicator's buffers */
  void* host_buf; /* _test_host_capsule only: freed with the tensor */
} DpsDLTensor;

static long g_test_deleted = 0; /* host test capsules whose deleter ran */

static void dl_deleter(DLManagedTensor* m) {
  DpsDLTensor* d = (DpsDLTensor*)m->manager_ctx;
  handle_release(d->owner);
  if (d->host_buf != NULL) {
    free(d->host_buf);
    __atomic_add_fetch(&g_test_deleted, 1, __ATOMIC_RELAXED);
  }
  free(d);
}

static void dl_capsule_destructor(PyObject* cap) {
  /* Not consumed (still named "dltensor"): we own it. */
  if (!PyCapsule_IsValid(cap, DPS_DLPACK_CAPSULE_NAME)) return;
  PyObject* pending = err_take();
  DLManagedTensor* m = (DLManagedTensor*)PyCapsule_GetPointer(cap, DPS_DLPACK_CAPSULE_NAME);
  if (m != NULL && m->deleter != NULL) m->deleter(m);
  if (pending != NULL) err_give(pending);
}

static const DLDataType dl_f32 = {kDLFloat, 32, 1};
static const DLDataType dl_bf16 = {kDLBfloat, 16, 1};
static const DLDataType dl_f16 = {kDLFloat, 16, 1};
static const DLDataType dl_i32 = {kDLInt, 32, 1};
static const DLDataType dl_u8 = {kDLUInt, 8, 1};

static DLDataType dl_of_dps(dpsDataType_t t) {
  return t == dpsBfloat16 ? dl_bf16 : t == dpsFloat16 ? dl_f16 : dl_f32;
}

/* A "dltensor" capsule over `ptr`, row-major, 1-D or 2-D. It keeps `owner`
 * (may be NULL) alive until the consumer calls the deleter. */
static PyObject* make_capsule(Handle* owner, void* host_buf, void* ptr, int device_type,
                              int device, DLDataType dt, int ndim, const int64_t* shape) {
  DpsDLTensor* d = (DpsDLTensor*)calloc(1, sizeof *d);
  if (d == NULL) return PyErr_NoMemory();
  for (int i = 0; i < ndim; ++i) d->shape[i] = shape[i];
  if (ndim == 2) {
    d->strides[0] = shape[1];
    d->strides[1] = 1;
  } else {
    d->strides[0] = 1;
  }
  d->owner = owner;
  if (owner != NULL) handle_retain(owner);
  d->host_buf = host_buf;
  DLTensor* t = &d->m.dl_tensor;
  t->data = ptr;
  t->device.device_type = device_type;
  t->device.device_id = device;
  t->ndim = ndim;
  t->dtype = dt;
  t->shape = d->shape;
  t->strides = d->strides;
  t->byte_offset = 0;
  d->m.manager_ctx = d;
  d->m.deleter = dl_deleter;
  PyObject* cap = PyCapsule_New(&d->m, DPS_DLPACK_CAPSULE_NAME, dl_capsule_destructor);
  if (cap == NULL) dl_deleter(&d->m);
  return cap;
}

/* A torch tensor aliasing `ptr` on cuda:`device`, row-major, 1-D or 2-D.
 * The tensor keeps `owner` alive. */
static PyObject* make_tensor(Handle* owner, void* ptr, int device, DLDataType dt, int ndim,
                             const int64_t* shape) {
  if (torch_load() != 0) return NULL;
  PyObject* cap = make_capsule(owner, NULL, ptr, kDLCUDA, device, dt, ndim, shape);
  if (cap == NULL) return NULL;
  PyObject* tensor = PyObject_CallOneArg(t_from_dlpack, cap);
  Py_DECREF(cap); /* consumed by torch (renamed), or freed here through the destructor */
  return tensor;
}

/* ------------------------------------------------------------------------- */
/* Tensors in                                                                 */

typedef struct {
  void* ptr;
  Py_ssize_t ndim;
  int64_t shape[2];
  int64_t nbytes;
} TArg;

/* t.dtype (new reference); TypeError when t is not a tensor. */
static PyObject* tensor_dtype(PyObject* t, const char* name) {
  PyObject* dt = PyObject_GetAttr(t, s_dtype);
  if (dt == NULL) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s must be a torch.Tensor, got %.200s", name, Py_TYPE(t)->tp_name);
  }
  return dt;
}

static int long_of_call(PyObject* t, PyObject* meth, long long* v) {
  PyObject* r = PyObject_CallMethodNoArgs(t, meth);
  if (r == NULL) return -1;
  *v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Device, layout and pointer of a tensor argument. want_ndim < 0: any rank
 * (shape not recorded), want_nbytes: also read t.nbytes. */
static int tensor_arg(PyObject* t, const char* name, int device, int want_ndim, int want_nbytes,
                      TArg* a) {
  long long dev;
  if (long_of_call(t, s_get_device, &dev) != 0) return -1;
  if (dev != device) {
    if (dev < 0)
      PyErr_Format(PyExc_ValueError, "%s must be a CUDA tensor on cuda:%d (the communicator's device), got a CPU tensor",
                   name, device);
    else
      PyErr_Format(PyExc_ValueError, "%s is on cuda:%lld but the communicator is on cuda:%d", name,
                   dev, device);
    return -1;
  }
  PyObject* shape = PyObject_GetAttr(t, s_shape);
  if (shape == NULL) return -1;
  if (!PyTuple_Check(shape)) {
    Py_DECREF(shape);
    PyErr_Format(PyExc_TypeError, "%s.shape is not a tuple", name);
    return -1;
  }
  a->ndim = PyTuple_GET_SIZE(shape);
  if (want_ndim >= 0) {
    if (a->ndim != want_ndim) {
      PyErr_Format(PyExc_ValueError, "%s must be %d-D, got shape %R", name, want_ndim, shape);
      Py_DECREF(shape);
      return -1;
    }
    for (int i = 0; i < want_ndim; ++i) {
      a->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
      if (a->shape[i] == -1 && PyErr_Occurred()) {
        Py_DECREF(shape);
        return -1;
      }
    }
  }
  Py_DECREF(shape);
  PyObject* c = PyObject_CallMethodNoArgs(t, s_is_contiguous);
  if (c == NULL) return -1;
  int contig = PyObject_IsTrue(c);
  Py_DECREF(c);
  if (contig < 0) return -1;
  if (!contig) {
    PyErr_Format(PyExc_ValueError,
                 "%s must be contiguous (row-major); call .contiguous() first", name);
    return -1;
  }
  PyObject* r = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (r == NULL) return -1;
  a->ptr = PyLong_AsVoidPtr(r);
  Py_DECREF(r);
  if (a->ptr == NULL && PyErr_Occurred()) return -1;
  if (want_nbytes) {
    PyObject* nb = PyObject_GetAttr(t, s_nbytes);
    if (nb == NULL) return -1;
    a->nbytes = PyLong_AsLongLong(nb);
    Py_DECREF(nb);
    if (a->nbytes == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

/* Logits dtype of a Python object: None -> unset, a torch dtype (fp32, bf16,
 * fp16) or a name ("fp32", "float32", "torch.float32", ...). -2 (TypeError
 * set) otherwise. */
static int dtype_code_of(PyObject* o, int allow_none, const char* name) {
  if (o == Py_None && allow_none) return dpsDtypeUnset;
  if (PyUnicode_Check(o)) {
    const char* s = PyUnicode_AsUTF8(o);
    if (s == NULL) return -2;
    if (strncmp(s, "torch.", 6) == 0) s += 6;
    if (!strcmp(s, "fp32") || !strcmp(s, "float32") || !strcmp(s, "float")) return dpsFloat32;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) return dpsBfloat16;
    if (!strcmp(s, "fp16") || !strcmp(s, "float16") || !strcmp(s, "half")) return dpsFloat16;
  } else if (strcmp(Py_TYPE(o)->tp_name, "torch.dtype") == 0) {
    if (torch_load() != 0) return -2;
    if (o == t_f32) return dpsFloat32;
    if (o == t_bf16) return dpsBfloat16;
    if (o == t_f16) return dpsFloat16;
  }
  PyErr_Format(PyExc_TypeError,
               "%s=%R is not a supported logits dtype; expected torch.float32, torch.bfloat16 or "
               "torch.float16, or one of the names 'fp32', 'float32', 'float', 'bf16', "
               "'bfloat16', 'fp16', 'float16', 'half' (each also with a 'torch.' prefix)%s",
               name, o, allow_none ? ", or None" : "");
  return -2;
}

/* pad_bs implied by a [pad_bs/tp, ...] input: rows*tp, or -1 (rejected by
 * pad_bs_arg) when that does not fit in an int. */
static long inferred_pad_bs(int64_t rows, int tp) {
  if (rows < 0 || tp < 1 || rows > INT32_MAX / tp) return -1;
  return (long)(rows * tp);
}

/* pad_bs argument: an int, or None -> `dflt`. */
static int pad_bs_arg(PyObject* o, long dflt, int* pad_bs) {
  long v = dflt;
  if (o != Py_None) {
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
      PyErr_Format(PyExc_TypeError, "pad_bs must be an int, got %.200s", Py_TYPE(o)->tp_name);
      return -1;
    }
    PyObject* i = PyNumber_Index(o); /* numpy and other integer types */
    if (i == NULL) return -1;
    int overflow = 0;
    v = PyLong_AsLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow) v = -1;
  }
  if (v < 1 || v > INT32_MAX) {
    if (o == Py_None)
      PyErr_Format(PyExc_ValueError,
                   "pad_bs could not be inferred from the input shape (got %ld); pass pad_bs=", v);
    else
      PyErr_Format(PyExc_ValueError, "pad_bs=%R must be a positive int", o);
    return -1;
  }
  *pad_bs = (int)v;
  return 0;
}

/* ------------------------------------------------------------------------- */
/* Device guard                                                               */

typedef struct {
  int prev, switched;
} DevGuard;

static cudaError_t dev_enter(DevGuard* g, int device) {
  g->switched = 0;
  cudaError_t e = cudaGetDevice(&g->prev);
  if (e != cudaSuccess) return e;
  if (g->prev != device) {
    e = cudaSetDevice(device);
    if (e != cudaSuccess) return e;
    g->switched = 1;
  }
  return cudaSuccess;
}

static void dev_leave(DevGuard* g) {
  if (g->switched) (void)cudaSetDevice(g->prev);
}

/* ------------------------------------------------------------------------- */
/* NcclGroup: one NCCL communicator per group                                 */

typedef struct {
  PyObject_HEAD SharedNccl* s;
  int initializing; /* ncclCommInitRank in progress without the GIL (GIL-protected) */
} NcclGroupObject;

static PyTypeObject NcclGroupType;

static int ncclgroup_init(NcclGroupObject* self, PyObject* args, PyObject* kw) {
  static char* kwlist[] = {"unique_id", "nranks", "rank", "device", NULL};
  Py_buffer uid;
  int nranks, rank, device;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*iii:NcclGroup", kwlist, &uid, &nranks, &rank,
                                   &device))
    return -1;
  if (self->s != NULL || self->initializing) {
    PyBuffer_Release(&uid);
    PyErr_SetString(PyExc_RuntimeError, self->initializing
                                            ? "NcclGroup is being initialized by another thread"
                                            : "NcclGroup is already initialized");
    return -1;
  }
  if (uid.len != (Py_ssize_t)sizeof(dpsUniqueId)) {
    PyErr_Format(PyExc_ValueError, "unique_id must be %zu bytes, got %zd", sizeof(dpsUniqueId),
                 uid.len);
    PyBuffer_Release(&uid);
    return -1;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks || device < 0) {
    PyBuffer_Release(&uid);
    PyErr_Format(PyExc_ValueError, "NcclGroup: nranks=%d rank=%d device=%d out of range", nranks,
                 rank, device);
    return -1;
  }
  ncclUniqueId id;
  memcpy(&id, uid.buf, sizeof id); /* dpsUniqueId carries an ncclUniqueId */
  PyBuffer_Release(&uid);
  ncclComm_t comm = NULL;
  ncclResult_t nr = ncclSuccess;
  cudaError_t ce;
  self->initializing = 1; /* a second __init__ meanwhile must not start another */
  Py_BEGIN_ALLOW_THREADS;
  DevGuard g;
  ce = dev_enter(&g, device);
  if (ce == cudaSuccess) {
    nr = ncclCommInitRank(&comm, nranks, id, rank);
    dev_leave(&g);
  }
  Py_END_ALLOW_THREADS;
  self->initializing = 0;
  if (ce != cudaSuccess) {
    PyErr_Format(PyExc_RuntimeError, "cudaSetDevice(%d) failed: %s", device, cudaGetErrorString(ce));
    return -1;
  }
  if (nr != ncclSuccess) {
    PyErr_Format(PyExc_RuntimeError, "ncclCommInitRank(nranks=%d, rank=%d, device=%d) failed: %s",
                 nranks, rank, device, ncclGetErrorString(nr));
    return -1;
  }
  SharedNccl* s = (SharedNccl*)calloc(1, sizeof *s);
  if (s == NULL) {
    ncclCommDestroy(comm);
    PyErr_NoMemory();
    return -1;
  }
  s->refs = 1;
  s->comm = comm;
  s->device = device;
  s->nranks = nranks;
  s->rank = rank;
  self->s = s;
  return 0;
}

/* Collective (every rank together): destroys the group's NCCL
 * communicator. Refused while a communicator created on it is open. */
static PyObject* ncclgroup_destroy(NcclGroupObject* self, PyObject* unused) {
  (void)unused;
  SharedNccl* s = self->s;
  if (s == NULL || s->comm == NULL) Py_RETURN_NONE;
  const long users = __atomic_load_n(&s->open_users, __ATOMIC_ACQUIRE);
  if (users > 0) {
    PyErr_Format(PyExc_RuntimeError,
                 "destroy_group_communicators: %ld DpSamplingComm(s) on group (rank %d of %d) "
                 "are still open; close() them first (nothing was destroyed)",
                 users, s->rank, s->nranks);
    return NULL;
  }
  ncclComm_t c = s->comm;
  s->comm = NULL;
  Py_BEGIN_ALLOW_THREADS;
  DevGuard g;
  if (dev_enter(&g, s->device) == cudaSuccess) {
    ncclCommDestroy(c);
    dev_leave(&g);
  }
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

static PyObject* ncclgroup_open_users(NcclGroupObject* self, PyObject* unused) {
  (void)unused;
  return PyLong_FromLong(self->s ? __atomic_load_n(&self->s->open_users, __ATOMIC_ACQUIRE) : 0);
}

static PyMethodDef ncclgroup_methods[] = {
    {"destroy", (PyCFunction)ncclgroup_destroy, METH_NOARGS,
     "destroy($self, /)\n--\n\nDestroy the group's NCCL communicator (collective); refused while "
     "a communicator on it is open."},
    {"open_users", (PyCFunction)ncclgroup_open_users, METH_NOARGS,
     "open_users($self, /)\n--\n\nHow many communicators on this group are not closed."},
    {NULL, NULL, 0, NULL}};

static void ncclgroup_dealloc(NcclGroupObject* self) {
  shared_nccl_release(self->s);
  self->s = NULL;
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* ncclgroup_get(NcclGroupObject* self, void* which) {
  if (self->s == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "NcclGroup is not initialized");
    return NULL;
  }
  switch ((int)(intptr_t)which) {
    case 0: return PyLong_FromLong(self->s->nranks);
    case 1: return PyLong_FromLong(self->s->rank);
    default: return PyLong_FromLong(self->s->device);
  }
}

static PyGetSetDef ncclgroup_getset[] = {
    {"nranks", (getter)ncclgroup_get, NULL, "ranks in the group", (void*)0},
    {"rank", (getter)ncclgroup_get, NULL, "this process's rank in the group", (void*)1},
    {"device", (getter)ncclgroup_get, NULL, "CUDA device of the communicator", (void*)2},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject NcclGroupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dpsampling._dpsampling.NcclGroup",
    .tp_basicsize = sizeof(NcclGroupObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NcclGroup(unique_id: bytes, nranks, rank, device): the library's own NCCL "
              "communicator for one group (ncclCommInitRank; collective).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ncclgroup_init,
    .tp_dealloc = (destructor)ncclgroup_dealloc,
    .tp_getset = ncclgroup_getset,
    .tp_methods = ncclgroup_methods,
};

/* The group's NcclGroup: the registry first, then the Python resolver. */
static NcclGroupObject* lookup_group(PyObject* group) {
  if (g_registry != NULL && group != Py_None && PyTuple_CheckExact(group)) {
    PyObject* item = PyDict_GetItemWithError(g_registry, group);
    if (item != NULL && Py_IS_TYPE(item, &NcclGroupType) && ((NcclGroupObject*)item)->s != NULL &&
        ((NcclGroupObject*)item)->s->comm != NULL) {
      Py_INCREF(item);
      return (NcclGroupObject*)item;
    }
    if (PyErr_Occurred()) return NULL;
  }
  if (g_resolver == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "dpsampling: no group resolver installed");
    return NULL;
  }
  PyObject* r = PyObject_CallOneArg(g_resolver, group);
  if (r == NULL) return NULL;
  if (!Py_IS_TYPE(r, &NcclGroupType) || ((NcclGroupObject*)r)->s == NULL ||
      ((NcclGroupObject*)r)->s->comm == NULL) {
    Py_DECREF(r);
    PyErr_SetString(PyExc_RuntimeError, "dpsampling: the group resolver did not return an NcclGroup");
    return NULL;
  }
  return (NcclGroupObject*)r;
}

/* ------------------------------------------------------------------------- */
/* Python collectives (fallback_comm_backend) as a dpsCollectives_t           */

typedef struct {
  PyObject* backend; /* object with all_gather_into_tensor / all_to_all_single */
  PyObject* group;   /* tuple of global ranks, passed as group= */
  Handle* owner;     /* borrowed: the Comm object outlives its adapter's use */
  int device, tp;
  PyObject* exc; /* exception raised inside a callback, re-raised by the op */
} Adapter;

static void adapter_free(Adapter* a) {
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
  PyObject *in = NULL, *out = NULL, *fn = NULL, *args = NULL, *kw = NULL, *ret = NULL;
  in = make_tensor(a->owner, (void*)send, a->device, dl_u8, 1, &send_bytes);
  if (in != NULL) out = make_tensor(a->owner, recv, a->device, dl_u8, 1, &recv_bytes);
  if (out != NULL) fn = PyObject_GetAttrString(a->backend, method);
  if (fn != NULL) args = PyTuple_Pack(2, out, in);
  if (args != NULL) kw = Py_BuildValue("{sO}", "group", a->group);
  if (kw != NULL) ret = PyObject_Call(fn, args, kw);
  if (ret == NULL) {
    if (a->exc == NULL) a->exc = err_take();
    else PyErr_Clear();
    res = dpsInternalError;
  }
  Py_XDECREF(ret);
  Py_XDECREF(kw);
  Py_XDECREF(args);
  Py_XDECREF(fn);
  Py_XDECREF(out);
  Py_XDECREF(in);
  PyGILState_Release(gs);
  return res;
}

static dpsResult_t adapter_all_gather(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                                      struct CUstream_st* stream) {
  (void)stream; /* == torch's current stream: the op was called with it */
  Adapter* a = (Adapter*)ctx;
  return adapter_invoke(a, "all_gather_into_tensor", sendbuf, (int64_t)bytes, recvbuf,
                        (int64_t)bytes * a->tp);
}

static dpsResult_t adapter_all_to_all(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                                      struct CUstream_st* stream) {
  (void)stream;
  Adapter* a = (Adapter*)ctx;
  return adapter_invoke(a, "all_to_all_single", sendbuf, (int64_t)bytes * a->tp, recvbuf,
                        (int64_t)bytes * a->tp);
}

/* ------------------------------------------------------------------------- */
/* Comm: base type of dpsampling.DpSamplingComm                               */

/* A call in progress and the GIL.
 *
 * Every library call that may block the host runs without the GIL: creation
 * (NCCL bootstrap traffic, an all-gather, a host sync), prepare (collective
 * window registration), the operations (the first swap on a communicator
 * whose dtype is unset prepares; NCCL may connect lazily on a first
 * collective) and destroy (handle_release). With one thread per rank in one
 * process, a rank blocked there with the GIL would keep the others from
 * reaching the same collective. Only C locals (pointers, sizes, the stream)
 * cross a GIL-free section; tensors are built and exceptions raised after it,
 * on the same thread, so dpsGetLastError() (per thread) is the failing call's.
 *
 * Meanwhile another thread can reach the object, and so can Python code that
 * a call runs on its own thread (tensor attribute reads, torch's stream, a
 * fallback_comm_backend callback, which reacquires the GIL in
 * adapter_invoke). `busy` names the call in progress, from comm_enter to
 * comm_leave; it is read and written with the GIL held only. While it is set:
 *  - another operation, prepare, _create or _set_collectives raises
 *    RuntimeError: the library allows one host thread at a time per
 *    communicator, and a callback re-entering its own communicator would
 *    re-enter the library;
 *  - close() raises RuntimeError; tp_clear leaves the object alone; dealloc
 *    cannot run, since the call holds a reference to the object;
 *  - the getters report `info`, the state as of the end of the previous call
 *    (dpsCommGetInfo would read fields the call may be writing);
 *  - async_error() still works: dpsCommGetAsyncError may run beside an
 *    operation (a watchdog thread), and self->h stays valid, since close()
 *    is refused and the call holds the handle.
 * The call also holds a reference to the handle and works on that, never on
 * self->h (the hold that prepare used to take alone). */
typedef struct {
  PyObject_HEAD Handle* h;
  int device, tp, n, max_pad_bs;
  int64_t vocab;
  /* cached output views, indexed by pad_bs (0..max_pad_bs) */
  PyObject** swap_views;
  void* swap_ptr;
  PyObject** gather_views; /* tuples (predict, accept_index, accept_length) */
  int32_t* gather_ptrs[3];
  PyObject** logprob_views;
  float* logprob_ptr;
  Adapter* adapter;
  const char* busy;   /* name of the call in progress, or NULL (see above) */
  dpsCommInfo_t info; /* snapshot for the getters while busy */
} CommObject;

static PyTypeObject CommType;

static void clear_views(PyObject** v, int max_pad_bs) {
  if (v == NULL) return;
  for (int i = 0; i <= max_pad_bs; ++i) Py_CLEAR(v[i]);
}

static void free_views(PyObject** v, int max_pad_bs) {
  clear_views(v, max_pad_bs);
  PyMem_Free(v);
}

/* Takes everything off the object first, then lets it go: dropping a view or
 * the adapter's objects can run Python code, which then finds the object
 * closed, and the last handle reference destroys without the GIL. Callers
 * make sure no call is in progress (busy == NULL). */
static void comm_release(CommObject* self) {
  PyObject** sv = self->swap_views;
  PyObject** gv = self->gather_views;
  PyObject** lv = self->logprob_views;
  Adapter* a = self->adapter;
  Handle* h = self->h;
  self->swap_views = self->gather_views = self->logprob_views = NULL;
  self->adapter = NULL;
  self->h = NULL;
  if (a != NULL && h != NULL) (void)dpsCommSetCollectives(h->comm, NULL);
  free_views(sv, self->max_pad_bs);
  free_views(gv, self->max_pad_bs);
  free_views(lv, self->max_pad_bs);
  adapter_free(a);
  handle_release(h);
}

static int comm_traverse(CommObject* self, visitproc visit, void* arg) {
  if (self->adapter != NULL) {
    Py_VISIT(self->adapter->backend);
    Py_VISIT(self->adapter->group);
    Py_VISIT(self->adapter->exc);
  }
  return 0;
}

static int comm_clear(CommObject* self) {
  if (self->busy != NULL) return 0; /* a call uses the adapter (and holds self): not garbage */
  Adapter* a = self->adapter;
  if (a != NULL) {
    self->adapter = NULL;
    if (self->h != NULL) (void)dpsCommSetCollectives(self->h->comm, NULL);
    adapter_free(a);
  }
  return 0;
}

/* Garbage-collected without close(): warn; the release stays local (no
 * collective step from a finalizer: the other ranks are not here). */
static void comm_finalize(CommObject* self) {
  if (self->h == NULL || !self->h->open || shutting_down()) return;
  PyObject* pending = err_take();
  if (PyErr_WarnFormat(PyExc_ResourceWarning, 1,
                       "DpSamplingComm (rank %d of %d) was garbage-collected without close(): "
                       "its collective teardown was skipped on this rank; call close() on every "
                       "rank together",
                       self->info.rank, self->info.tp_size) < 0)
    PyErr_WriteUnraisable((PyObject*)self);
  if (pending != NULL) err_give(pending);
}

static void comm_dealloc(CommObject* self) {
  /* busy is NULL here: a call in progress holds a reference to self. */
  if (PyObject_CallFinalizerFromDealloc((PyObject*)self) < 0) return; /* resurrected */
  PyObject_GC_UnTrack(self);
  handle_unuse(self->h);
  comm_release(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static int comm_open(CommObject* self) {
  if (self->h == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "the DpSamplingComm is closed (or was never created)");
    return -1;
  }
  return 0;
}

static PyObject* busy_error(CommObject* self, const char* what) {
  PyErr_Format(PyExc_RuntimeError,
               "DpSamplingComm.%s: the communicator is in use by %s on another thread (or this "
               "is a callback of that call); a communicator may be used by one thread at a time, "
               "so wait for that call to return",
               what, self->busy);
  return NULL;
}

/* Starts the call `op` (see "A call in progress" above). With hp, the
 * communicator must be open and *hp gets a reference to its handle; without
 * (_create), none is taken. Returns -1 with RuntimeError while busy. */
static int comm_enter(CommObject* self, const char* op, Handle** hp) {
  if (self->busy != NULL) {
    busy_error(self, op);
    return -1;
  }
  if (hp != NULL) {
    if (comm_open(self) != 0) return -1;
    *hp = self->h;
    handle_retain(*hp);
  }
  self->busy = op;
  Py_INCREF(self);
  return 0;
}

/* Releases the GIL for an operation call that may block on the host (else
 * returns NULL), since another rank's thread of this process may need the
 * GIL to reach the same collective: the first swap prepares (collective),
 * and NCCL's enqueue may set up connections with the peers. A prepared onesided
 * communicator only launches a kernel: keeping the GIL there avoids handing
 * it to another thread for a call of a few microseconds, since getting it
 * back can take the interpreter's switch interval (5 ms by default). */
static PyThreadState* op_gil_drop(const CommObject* self) {
  const int may_block = !self->info.initialized || self->info.backend != dpsBackendOnesided;
  return may_block ? PyEval_SaveThread() : NULL; /* give back with gil_take() */
}

/* Ends the call. Raise before leaving: the handle reference is dropped here
 * (never the last one, as close() waits for the call, but keep it so). */
static void comm_leave(CommObject* self, Handle* h) {
  if (h != NULL) (void)dpsCommGetInfo(h->comm, &self->info);
  self->busy = NULL;
  handle_release(h);
  Py_DECREF(self);
}

static PyObject* op_fail(CommObject* self, dpsResult_t r) {
  Adapter* a = self->adapter;
  if (a != NULL && a->exc != NULL) { /* the Python collective raised: re-raise that */
    PyObject* e = a->exc;
    a->exc = NULL;
    err_give(e);
    return NULL;
  }
  return raise_dps(r);
}

static void adapter_reset(CommObject* self) {
  Adapter* a = self->adapter;
  if (a != NULL) Py_CLEAR(a->exc);
}

/* _create(nccl_group, tp_size, rank, max_pad_bs, num_tokens_per_req, vocab_size,
 *         dtype_code, backend_code, device, timeout_ms=0) */
static PyObject* comm_create(CommObject* self, PyObject* args) {
  NcclGroupObject* grp;
  int tp, rank, max_pad_bs, n, dtype, backend, device, timeout_ms = 0;
  long long vocab;
  if (!PyArg_ParseTuple(args, "O!iiiiLiii|i:_create", &NcclGroupType, &grp, &tp, &rank,
                        &max_pad_bs, &n, &vocab, &dtype, &backend, &device, &timeout_ms))
    return NULL;
  if (self->busy != NULL) return busy_error(self, "_create");
  if (self->h != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "the DpSamplingComm is already created");
    return NULL;
  }
  if (grp->s == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "NcclGroup is not initialized");
    return NULL;
  }
  dpsConfig_t cfg = DPS_CONFIG_INITIALIZER;
  cfg.tp_size = tp;
  cfg.rank = rank;
  cfg.max_pad_bs = max_pad_bs;
  cfg.num_tokens_per_req = n;
  cfg.vocab_size = (int64_t)vocab;
  cfg.logits_dtype = (dpsDataType_t)dtype;
  cfg.backend = (dpsBackend_t)backend;
  cfg.cuda_device = device;
  cfg.timeout_ms = timeout_ms;
  dpsResult_t r = dpsConfigCheck(&cfg);
  if (r != dpsSuccess) return raise_dps(r);
  Handle* h = (Handle*)calloc(1, sizeof *h);
  PyObject** sv = PyMem_Calloc((size_t)max_pad_bs + 1, sizeof(PyObject*));
  PyObject** gv = PyMem_Calloc((size_t)max_pad_bs + 1, sizeof(PyObject*));
  PyObject** lv = PyMem_Calloc((size_t)max_pad_bs + 1, sizeof(PyObject*));
  if (h == NULL || sv == NULL || gv == NULL || lv == NULL) {
    free(h);
    PyMem_Free(sv);
    PyMem_Free(gv);
    PyMem_Free(lv);
    return PyErr_NoMemory();
  }
  if (comm_enter(self, "_create", NULL) != 0) { /* cannot fail: checked above */
    free(h);
    PyMem_Free(sv);
    PyMem_Free(gv);
    PyMem_Free(lv);
    return NULL;
  }
  /* The creation borrows the group's NCCL communicator: hold it across the
   * GIL-free section (the registry may drop the group meanwhile); on success
   * this reference becomes the handle's. */
  SharedNccl* s = grp->s;
  shared_nccl_retain(s);
  dpsComm_t comm = NULL;
  ncclComm_t nc = s->comm;
  Py_BEGIN_ALLOW_THREADS;
  r = dpsCommInitFromNccl(&comm, nc, &cfg);
  Py_END_ALLOW_THREADS;
  if (r != dpsSuccess) {
    raise_dps(r); /* before anything else can call the library on this thread */
    free(h);
    PyMem_Free(sv);
    PyMem_Free(gv);
    PyMem_Free(lv);
    shared_nccl_release(s); /* not the last: grp holds one */
    comm_leave(self, NULL);
    return NULL;
  }
  h->refs = 1;
  h->comm = comm;
  h->nccl = s;
  h->open = 1;
  __atomic_add_fetch(&s->open_users, 1, __ATOMIC_ACQ_REL);
  self->h = h;
  self->device = device;
  self->tp = tp;
  self->n = n;
  self->max_pad_bs = max_pad_bs;
  self->vocab = (int64_t)vocab;
  self->swap_views = sv;
  self->gather_views = gv;
  self->logprob_views = lv;
  self->swap_ptr = NULL;
  self->gather_ptrs[0] = self->gather_ptrs[1] = self->gather_ptrs[2] = NULL;
  self->logprob_ptr = NULL;
  (void)dpsCommGetInfo(comm, &self->info);
  comm_leave(self, NULL);
  Py_RETURN_NONE;
}

/* _set_collectives(backend_or_None, group) */
static PyObject* set_collectives_body(CommObject* self, Handle* h, PyObject* backend,
                                      PyObject* group) {
  Adapter* old = self->adapter;
  if (backend == Py_None) {
    (void)dpsCommSetCollectives(h->comm, NULL);
    self->adapter = NULL;
    adapter_free(old);
    Py_RETURN_NONE;
  }
  if (!PyObject_HasAttrString(backend, "all_gather_into_tensor")) {
    PyErr_Format(PyExc_TypeError,
                 "fallback_comm_backend=%R has no all_gather_into_tensor(output, input, group)",
                 backend);
    return NULL;
  }
  int has_all_to_all = PyObject_HasAttrString(backend, "all_to_all_single");
  Adapter* a = (Adapter*)calloc(1, sizeof *a);
  if (a == NULL) return PyErr_NoMemory();
  Py_INCREF(backend);
  Py_INCREF(group);
  a->backend = backend;
  a->group = group;
  a->owner = h; /* borrowed: close() and _set_collectives wait for calls using it */
  a->device = self->device;
  a->tp = self->tp;
  dpsCollectives_t table;
  table.ctx = a;
  table.all_gather = adapter_all_gather;
  /* all_to_all only when the object has it; otherwise NCCL */
  table.all_to_all = has_all_to_all ? adapter_all_to_all : NULL;
  dpsResult_t r = dpsCommSetCollectives(h->comm, &table);
  if (r != dpsSuccess) {
    raise_dps(r);
    adapter_free(a);
    return NULL;
  }
  self->adapter = a;
  adapter_free(old);
  Py_RETURN_NONE;
}

static PyObject* comm_set_collectives(CommObject* self, PyObject* args) {
  PyObject *backend, *group;
  if (!PyArg_ParseTuple(args, "OO:_set_collectives", &backend, &group)) return NULL;
  Handle* h;
  if (comm_enter(self, "_set_collectives", &h) != 0) return NULL;
  PyObject* ret = set_collectives_body(self, h, backend, group);
  comm_leave(self, h);
  return ret;
}

static PyObject* swap_view(CommObject* self, Handle* h, void* out, int pad_bs, dpsDataType_t dt) {
  if (out != self->swap_ptr) { /* a new buffer (never expected): drop stale views */
    clear_views(self->swap_views, self->max_pad_bs);
    self->swap_ptr = out;
  }
  PyObject* v = self->swap_views[pad_bs];
  if (v == NULL) {
    int64_t shape[2] = {(int64_t)(pad_bs / self->tp) * self->n, self->vocab};
    v = make_tensor(h, out, self->device, dl_of_dps(dt), 2, shape);
    if (v == NULL) return NULL;
    self->swap_views[pad_bs] = v;
  }
  Py_INCREF(v);
  return v;
}

static PyObject* swap_body(CommObject* self, Handle* h, PyObject* x, PyObject* pad_obj) {
  if (torch_load() != 0) return NULL;
  PyObject* dt = tensor_dtype(x, "local_logits");
  if (dt == NULL) return NULL;
  dpsDataType_t code = dt == t_f32 ? dpsFloat32 : dt == t_bf16 ? dpsBfloat16 : dt == t_f16 ? dpsFloat16 : dpsDtypeUnset;
  if (code == dpsDtypeUnset) {
    PyErr_Format(PyExc_TypeError,
                 "local_logits dtype %R is not supported; expected torch.float32, torch.bfloat16 "
                 "or torch.float16",
                 dt);
    Py_DECREF(dt);
    return NULL;
  }
  Py_DECREF(dt);
  TArg a;
  if (tensor_arg(x, "local_logits", self->device, 2, 0, &a) != 0) return NULL;
  long dflt = (a.shape[0] % self->n == 0) ? (long)(a.shape[0] / self->n) : -1;
  int pad_bs;
  if (pad_bs_arg(pad_obj, dflt, &pad_bs) != 0) return NULL;
  void* stream;
  if (current_stream(self->device, &stream) != 0) return NULL;
  adapter_reset(self);
  dpsComm_t comm = h->comm;
  void* out = NULL;
  dpsResult_t r;
  PyThreadState* ts = op_gil_drop(self);
  r = dpsSwapBatchVocab(comm, a.ptr, a.shape[0], a.shape[1], code, pad_bs, &out,
                        (struct CUstream_st*)stream);
  gil_take(ts);
  if (r != dpsSuccess) return op_fail(self, r);
  return swap_view(self, h, out, pad_bs, code);
}

static PyObject* comm_swap_impl(CommObject* self, PyObject* args, PyObject* kw, int copy) {
  static char* kwlist[] = {"local_logits", "pad_bs", NULL};
  PyObject* x;
  PyObject* pad_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:swap_batch_vocab", kwlist, &x, &pad_obj))
    return NULL;
  Handle* h;
  if (comm_enter(self, "swap_batch_vocab", &h) != 0) return NULL;
  PyObject* v = swap_body(self, h, x, pad_obj);
  comm_leave(self, h);
  if (v == NULL || !copy) return v;
  PyObject* c = PyObject_CallMethodNoArgs(v, s_clone); /* on torch's current stream */
  Py_DECREF(v);
  return c;
}

static PyObject* comm_swap(CommObject* self, PyObject* args, PyObject* kw) {
  return comm_swap_impl(self, args, kw, 0);
}

static PyObject* comm_swap_new(CommObject* self, PyObject* args, PyObject* kw) {
  return comm_swap_impl(self, args, kw, 1);
}

static int expect_dtype(PyObject* t, const char* name, PyObject* want, const char* want_name) {
  PyObject* dt = tensor_dtype(t, name);
  if (dt == NULL) return -1;
  int ok = dt == want;
  if (!ok) PyErr_Format(PyExc_TypeError, "%s must be %s, got %R", name, want_name, dt);
  Py_DECREF(dt);
  return ok ? 0 : -1;
}

static PyObject* gather_outputs_body(CommObject* self, Handle* h, PyObject* p, PyObject* ai,
                                     PyObject* al, PyObject* pad_obj) {
  if (torch_load() != 0) return NULL;
  if (expect_dtype(p, "predict", t_i32, "torch.int32") != 0 ||
      expect_dtype(ai, "accept_index", t_i32, "torch.int32") != 0 ||
      expect_dtype(al, "accept_length", t_i32, "torch.int32") != 0)
    return NULL;
  TArg tp_, tai, tal;
  if (tensor_arg(p, "predict", self->device, 2, 0, &tp_) != 0 ||
      tensor_arg(ai, "accept_index", self->device, 2, 0, &tai) != 0 ||
      tensor_arg(al, "accept_length", self->device, 1, 0, &tal) != 0)
    return NULL;
  if (tai.shape[0] != tp_.shape[0] || tai.shape[1] != tp_.shape[1]) {
    PyErr_Format(PyExc_ValueError, "accept_index is [%lld, %lld] but predict is [%lld, %lld]",
                 (long long)tai.shape[0], (long long)tai.shape[1], (long long)tp_.shape[0],
                 (long long)tp_.shape[1]);
    return NULL;
  }
  if (tal.shape[0] != tp_.shape[0]) {
    PyErr_Format(PyExc_ValueError, "accept_length is [%lld] but predict has %lld rows",
                 (long long)tal.shape[0], (long long)tp_.shape[0]);
    return NULL;
  }
  int pad_bs;
  if (pad_bs_arg(pad_obj, inferred_pad_bs(tp_.shape[0], self->tp), &pad_bs) != 0) return NULL;
  void* stream;
  if (current_stream(self->device, &stream) != 0) return NULL;
  adapter_reset(self);
  dpsComm_t comm = h->comm;
  int32_t *po = NULL, *aio = NULL, *alo = NULL;
  dpsResult_t r;
  PyThreadState* ts = op_gil_drop(self);
  r = dpsGatherVerifyOutputs(comm, (const int32_t*)tp_.ptr, (const int32_t*)tai.ptr,
                             (const int32_t*)tal.ptr, tp_.shape[0], tp_.shape[1], pad_bs, &po,
                             &aio, &alo, (struct CUstream_st*)stream);
  gil_take(ts);
  if (r != dpsSuccess) return op_fail(self, r);
  if (po != self->gather_ptrs[0] || aio != self->gather_ptrs[1] || alo != self->gather_ptrs[2]) {
    clear_views(self->gather_views, self->max_pad_bs);
    self->gather_ptrs[0] = po;
    self->gather_ptrs[1] = aio;
    self->gather_ptrs[2] = alo;
  }
  PyObject* v = self->gather_views[pad_bs];
  if (v == NULL) {
    int64_t s2[2] = {pad_bs, self->n};
    int64_t s1[1] = {pad_bs};
    PyObject* a = make_tensor(h, po, self->device, dl_i32, 2, s2);
    PyObject* b = a ? make_tensor(h, aio, self->device, dl_i32, 2, s2) : NULL;
    PyObject* c = b ? make_tensor(h, alo, self->device, dl_i32, 1, s1) : NULL;
    if (c == NULL) {
      Py_XDECREF(a);
      Py_XDECREF(b);
      return NULL;
    }
    v = PyTuple_Pack(3, a, b, c);
    Py_DECREF(a);
    Py_DECREF(b);
    Py_DECREF(c);
    if (v == NULL) return NULL;
    self->gather_views[pad_bs] = v;
  }
  Py_INCREF(v);
  return v;
}

static PyObject* comm_gather_outputs(CommObject* self, PyObject* args, PyObject* kw) {
  static char* kwlist[] = {"predict", "accept_index", "accept_length", "pad_bs", NULL};
  PyObject *p, *ai, *al;
  PyObject* pad_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:gather_verify_outputs", kwlist, &p, &ai, &al,
                                   &pad_obj))
    return NULL;
  Handle* h;
  if (comm_enter(self, "gather_verify_outputs", &h) != 0) return NULL;
  PyObject* v = gather_outputs_body(self, h, p, ai, al, pad_obj);
  comm_leave(self, h);
  return v;
}

static PyObject* gather_logprobs_body(CommObject* self, Handle* h, PyObject* x, PyObject* pad_obj) {
  if (torch_load() != 0) return NULL;
  if (expect_dtype(x, "logprobs", t_f32, "torch.float32") != 0) return NULL;
  TArg a;
  if (tensor_arg(x, "logprobs", self->device, 2, 0, &a) != 0) return NULL;
  int pad_bs;
  if (pad_bs_arg(pad_obj, inferred_pad_bs(a.shape[0], self->tp), &pad_bs) != 0) return NULL;
  void* stream;
  if (current_stream(self->device, &stream) != 0) return NULL;
  adapter_reset(self);
  dpsComm_t comm = h->comm;
  float* out = NULL;
  dpsResult_t r;
  PyThreadState* ts = op_gil_drop(self);
  r = dpsGatherVerifyLogprobs(comm, (const float*)a.ptr, a.shape[0], a.shape[1], pad_bs, &out,
                              (struct CUstream_st*)stream);
  gil_take(ts);
  if (r != dpsSuccess) return op_fail(self, r);
  if (out != self->logprob_ptr) {
    clear_views(self->logprob_views, self->max_pad_bs);
    self->logprob_ptr = out;
  }
  PyObject* v = self->logprob_views[pad_bs];
  if (v == NULL) {
    int64_t s2[2] = {pad_bs, self->n};
    v = make_tensor(h, out, self->device, dl_f32, 2, s2);
    if (v == NULL) return NULL;
    self->logprob_views[pad_bs] = v;
  }
  Py_INCREF(v);
  return v;
}

static PyObject* comm_gather_logprobs(CommObject* self, PyObject* args, PyObject* kw) {
  static char* kwlist[] = {"logprobs", "pad_bs", NULL};
  PyObject* x;
  PyObject* pad_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:gather_verify_logprobs", kwlist, &x, &pad_obj))
    return NULL;
  Handle* h;
  if (comm_enter(self, "gather_verify_logprobs", &h) != 0) return NULL;
  PyObject* v = gather_logprobs_body(self, h, x, pad_obj);
  comm_leave(self, h);
  return v;
}

static PyObject* comm_prepare(CommObject* self, PyObject* args, PyObject* kw) {
  static char* kwlist[] = {"dtype", NULL};
  PyObject* d;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:prepare_verify_outputs", kwlist, &d)) return NULL;
  Handle* h;
  if (comm_enter(self, "prepare_verify_outputs", &h) != 0) return NULL;
  PyObject* ret = NULL;
  int code = dtype_code_of(d, 0, "dtype"); /* may import torch */
  if (code != -2) {
    adapter_reset(self);
    dpsComm_t comm = h->comm;
    dpsResult_t r;
    Py_BEGIN_ALLOW_THREADS; /* collective and blocking */
    r = dpsCommPrepare(comm, (dpsDataType_t)code);
    Py_END_ALLOW_THREADS;
    if (r != dpsSuccess) {
      op_fail(self, r);
    } else {
      ret = Py_None;
      Py_INCREF(ret);
    }
  }
  comm_leave(self, h);
  return ret;
}

/* The collective teardown point (dpsCommClose), then the local release;
 * tensors that alias the outputs keep them valid until they go. Refused
 * while torch's current stream captures (changing nothing). */
static PyObject* comm_close(CommObject* self, PyObject* unused) {
  (void)unused;
  if (self->busy != NULL) return busy_error(self, "close()");
  if (self->h == NULL) Py_RETURN_NONE; /* closed already */
  Handle* h = self->h;
  if (torch_load() != 0) return NULL;
  void* stream = NULL;
  if (current_stream(self->device, &stream) != 0) return NULL;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) == cudaSuccess &&
      cs != cudaStreamCaptureStatusNone) {
    PyErr_Format(PyExc_RuntimeError,
                 "DpSamplingComm.close(): the current stream (%p) is capturing a CUDA graph; "
                 "close outside the capture (nothing was changed)",
                 stream);
    return NULL;
  }
  dpsResult_t r;
  Py_BEGIN_ALLOW_THREADS;
  r = dpsCommClose(h->comm);
  Py_END_ALLOW_THREADS;
  if (r != dpsSuccess) return raise_dps(r); /* refused: nothing changed */
  handle_unuse(h);
  comm_release(self); /* the handle lives on while tensors alias its buffers */
  (void)dpsReleasePending(NULL);
  Py_RETURN_NONE;
}

static PyObject* comm_async_error(CommObject* self, PyObject* unused) {
  (void)unused;
  if (comm_open(self) != 0) return NULL;
  /* no busy check: the one call that may run beside an operation */
  dpsResult_t st = dpsSuccess;
  dpsResult_t r = dpsCommGetAsyncError(self->h->comm, &st);
  if (r != dpsSuccess) return raise_dps(r);
  if (st == dpsSuccess) Py_RETURN_NONE;
  return PyUnicode_FromFormat("%s: %s", dpsGetErrorString(st), dpsGetLastError());
}

/* The communicator's state; while a call is in progress, as of its start. */
static int comm_info(CommObject* self, dpsCommInfo_t* info) {
  if (comm_open(self) != 0) return -1;
  if (self->busy != NULL) {
    *info = self->info;
    return 0;
  }
  dpsResult_t r = dpsCommGetInfo(self->h->comm, info);
  if (r != dpsSuccess) {
    raise_dps(r);
    return -1;
  }
  return 0;
}

enum {
  P_BACKEND,
  P_REQUESTED,
  P_FAST,
  P_MAX_PAD_BS,
  P_TP,
  P_RANK,
  P_N,
  P_VOCAB,
  P_INIT,
  P_DEVICE,
  P_DTYPE,
  P_TIMEOUT,
  P_CLOSED
};

static PyObject* comm_get(CommObject* self, void* which) {
  int w = (int)(intptr_t)which;
  if (w == P_CLOSED) return PyBool_FromLong(self->h == NULL);
  if (w == P_INIT && self->h == NULL) Py_RETURN_FALSE;
  dpsCommInfo_t info;
  if (comm_info(self, &info) != 0) return NULL;
  switch (w) {
    case P_BACKEND: return PyUnicode_FromString(dpsBackendName(info.backend));
    case P_REQUESTED: return PyUnicode_FromString(dpsBackendName(info.requested_backend));
    case P_FAST: return PyBool_FromLong(info.backend == dpsBackendOnesided);
    case P_MAX_PAD_BS: return PyLong_FromLong(info.max_pad_bs);
    case P_TP: return PyLong_FromLong(info.tp_size);
    case P_RANK: return PyLong_FromLong(info.rank);
    case P_N: return PyLong_FromLong(info.num_tokens_per_req);
    case P_VOCAB: return PyLong_FromLongLong(info.vocab_size);
    case P_INIT: return PyBool_FromLong(info.initialized);
    case P_DEVICE: return PyLong_FromLong(info.cuda_device);
    case P_TIMEOUT: return PyLong_FromLong(info.timeout_ms);
    case P_DTYPE:
      if (info.logits_dtype == dpsDtypeUnset) Py_RETURN_NONE;
      if (torch_load() != 0) return NULL;
      {
        PyObject* d = info.logits_dtype == dpsFloat32   ? t_f32
                      : info.logits_dtype == dpsBfloat16 ? t_bf16
                                                          : t_f16;
        Py_INCREF(d);
        return d;
      }
    default: Py_RETURN_NONE;
  }
}

static PyGetSetDef comm_getset[] = {
    {"backend", (getter)comm_get, NULL, "resolved backend: 'nccl' or 'onesided'", (void*)P_BACKEND},
    {"requested_backend", (getter)comm_get, NULL, "backend as requested", (void*)P_REQUESTED},
    {"fast_path_enabled", (getter)comm_get, NULL, "backend == 'onesided'", (void*)P_FAST},
    {"max_pad_bs", (getter)comm_get, NULL, NULL, (void*)P_MAX_PAD_BS},
    {"tp_size", (getter)comm_get, NULL, NULL, (void*)P_TP},
    {"rank", (getter)comm_get, NULL, NULL, (void*)P_RANK},
    {"num_tokens_per_req", (getter)comm_get, NULL, NULL, (void*)P_N},
    {"vocab_size", (getter)comm_get, NULL, NULL, (void*)P_VOCAB},
    {"is_initialized", (getter)comm_get, NULL, "every persistent buffer exists", (void*)P_INIT},
    {"cuda_device", (getter)comm_get, NULL, NULL, (void*)P_DEVICE},
    {"logits_dtype", (getter)comm_get, NULL, "torch dtype of the logits, or None while unset",
     (void*)P_DTYPE},
    {"timeout_ms", (getter)comm_get, NULL, "effective one-sided timeout", (void*)P_TIMEOUT},
    {"closed", (getter)comm_get, NULL, NULL, (void*)P_CLOSED},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef comm_methods[] = {
    {"_create", (PyCFunction)comm_create, METH_VARARGS, NULL},
    {"_set_collectives", (PyCFunction)comm_set_collectives, METH_VARARGS, NULL},
    {"swap_batch_vocab", (PyCFunction)(void (*)(void))comm_swap, METH_VARARGS | METH_KEYWORDS,
     "swap_batch_vocab($self, /, local_logits, pad_bs=None)\n--\n\n"
     "[pad_bs*N, V/tp] logits -> this rank's [pad_bs/tp*N, V] rows (a view of the persistent "
     "output, valid until the next swap). pad_bs=None: local_logits.shape[0] // N."},
    {"_swap_batch_vocab_new", (PyCFunction)(void (*)(void))comm_swap_new,
     METH_VARARGS | METH_KEYWORDS,
     "_swap_batch_vocab_new($self, /, local_logits, pad_bs=None)\n--\n\n"
     "swap_batch_vocab returning a new tensor (a copy)"},
    {"gather_verify_outputs", (PyCFunction)(void (*)(void))comm_gather_outputs,
     METH_VARARGS | METH_KEYWORDS,
     "gather_verify_outputs($self, /, predict, accept_index, accept_length, pad_bs=None)\n--\n\n"
     "int32 [pad_bs/tp, N], [pad_bs/tp, N], [pad_bs/tp] -> (predict [pad_bs, N], "
     "accept_index [pad_bs, N], accept_length [pad_bs]), views of persistent outputs."},
    {"gather_verify_logprobs", (PyCFunction)(void (*)(void))comm_gather_logprobs,
     METH_VARARGS | METH_KEYWORDS,
     "gather_verify_logprobs($self, /, logprobs, pad_bs=None)\n--\n\n"
     "float32 [pad_bs/tp, N] -> [pad_bs, N] (a view of the persistent output)."},
    {"prepare_verify_outputs", (PyCFunction)(void (*)(void))comm_prepare,
     METH_VARARGS | METH_KEYWORDS,
     "prepare_verify_outputs($self, /, dtype)\n--\n\n"
     "Fix the logits dtype if unset and allocate its buffers (collective)."},
    {"close", (PyCFunction)comm_close, METH_NOARGS,
     "close($self, /)\n--\n\nThe collective teardown: call it on every rank together, outside "
     "CUDA graph capture. Later calls raise; tensors returned earlier stay valid until they go."},
    {"async_error", (PyCFunction)comm_async_error, METH_NOARGS,
     "async_error($self, /)\n--\n\n"
     "None, or a description of the asynchronous error (e.g. a one-sided timeout)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject CommType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dpsampling._dpsampling.Comm",
    .tp_basicsize = sizeof(CommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Base of DpSamplingComm: one dpsComm_t.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)comm_dealloc,
    .tp_finalize = (destructor)comm_finalize,
    .tp_traverse = (traverseproc)comm_traverse,
    .tp_clear = (inquiry)comm_clear,
    .tp_methods = comm_methods,
    .tp_getset = comm_getset,
};

/* ------------------------------------------------------------------------- */
/* The library's default collectives object (get_global_backend())           */

typedef struct {
  PyObject_HEAD
} BackendObject;

static PyObject* backend_collective(PyObject* args, PyObject* kw, int all_to_all) {
  static char* kwlist[] = {"output", "input", "group", NULL};
  PyObject *out, *in;
  PyObject* group = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw,
                                   all_to_all ? "OO|O:all_to_all_single" : "OO|O:all_gather_into_tensor",
                                   kwlist, &out, &in, &group))
    return NULL;
  if (torch_load() != 0) return NULL;
  NcclGroupObject* g = lookup_group(group);
  if (g == NULL) return NULL;
  SharedNccl* s = g->s;
  shared_nccl_retain(s);
  Py_DECREF(g);
  PyObject* ret = NULL;
  TArg to, ti;
  if (tensor_arg(out, "output", s->device, -1, 1, &to) != 0 ||
      tensor_arg(in, "input", s->device, -1, 1, &ti) != 0)
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
  ncclResult_t nr = ncclSuccess;
  cudaError_t ce;
  Py_BEGIN_ALLOW_THREADS;
  DevGuard dg;
  ce = dev_enter(&dg, s->device);
  if (ce == cudaSuccess) {
    cudaStream_t st = (cudaStream_t)stream;
    if (!all_to_all) {
      if (ti.nbytes > 0) nr = ncclAllGather(ti.ptr, to.ptr, (size_t)ti.nbytes, ncclUint8, s->comm, st);
    } else if (ti.nbytes > 0) {
      size_t chunk = (size_t)ti.nbytes / (size_t)s->nranks;
      nr = ncclGroupStart();
      for (int p = 0; p < s->nranks && nr == ncclSuccess; ++p) {
        nr = ncclSend((const char*)ti.ptr + (size_t)p * chunk, chunk, ncclUint8, p, s->comm, st);
        if (nr == ncclSuccess)
          nr = ncclRecv((char*)to.ptr + (size_t)p * chunk, chunk, ncclUint8, p, s->comm, st);
      }
      ncclResult_t ne = ncclGroupEnd();
      if (nr == ncclSuccess) nr = ne;
    }
    dev_leave(&dg);
  }
  Py_END_ALLOW_THREADS;
  if (ce != cudaSuccess) {
    PyErr_Format(PyExc_RuntimeError, "cudaSetDevice(%d) failed: %s", s->device, cudaGetErrorString(ce));
    goto done;
  }
  if (nr != ncclSuccess) {
    PyErr_Format(PyExc_RuntimeError, "%s failed: %s", all_to_all ? "ncclSend/ncclRecv" : "ncclAllGather",
                 ncclGetErrorString(nr));
    goto done;
  }
  ret = Py_None;
  Py_INCREF(ret);
done:
  shared_nccl_release(s);
  return ret;
}

static PyObject* backend_all_gather(PyObject* self, PyObject* args, PyObject* kw) {
  (void)self;
  return backend_collective(args, kw, 0);
}

static PyObject* backend_all_to_all(PyObject* self, PyObject* args, PyObject* kw) {
  (void)self;
  return backend_collective(args, kw, 1);
}

static PyObject* backend_repr(PyObject* self) {
  (void)self;
  return PyUnicode_FromString("<dpsampling NCCL collectives (library default)>");
}

static PyMethodDef backend_methods[] = {
    {"all_gather_into_tensor", (PyCFunction)(void (*)(void))backend_all_gather,
     METH_VARARGS | METH_KEYWORDS,
     "all_gather_into_tensor($self, /, output, input, group=None)\n--\n\n"
     "NCCL all-gather of the bytes of input into output on the group's communicator, on "
     "torch's current stream."},
    {"all_to_all_single", (PyCFunction)(void (*)(void))backend_all_to_all,
     METH_VARARGS | METH_KEYWORDS,
     "all_to_all_single($self, /, output, input, group=None)\n--\n\n"
     "Equal-split NCCL all-to-all of bytes."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject BackendType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dpsampling._dpsampling.NcclCollectives",
    .tp_basicsize = sizeof(BackendObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The library's default collectives (NCCL on the group's shared communicator).",
    .tp_repr = backend_repr,
    .tp_methods = backend_methods,
};

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
  return make_capsule(NULL, buf, buf, kDLCPU, 0, cols > 0 ? dl_f32 : dl_i32, cols > 0 ? 2 : 1,
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
  ADD_INT(m, "HEADER_VERSION", DPS_VERSION_CODE);
  ADD_INT(m, "NCCL_HEADER_VERSION", NCCL_VERSION_CODE);
  return m;
}
