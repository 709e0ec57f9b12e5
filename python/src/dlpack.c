/* Tensors out: DLPack "dltensor" capsules over the communicator's buffers,
 * handed to torch's from_dlpack (no copies). */
#include "binding.h"

/* ------------------------------------------------------------------------- */
/* The public DLPack ABI (v0.x "dltensor" capsules), written out here so that
 * the extension needs no DLPack or torch headers; layouts as in
 * https://github.com/dmlc/dlpack/blob/main/include/dlpack/dlpack.h (enums are
 * 4-byte C ints). */

typedef struct {
  int32_t device_type; /* DLDeviceType */
  int32_t device_id;
} DLDevice;

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
/* DLPack out                                                                 */

typedef struct {
  DLManagedTensor m;
  int64_t shape[2];
  int64_t strides[2];
  Handle* owner;  /* device views: the communicator's buffers */
  void* host_buf; /* _test_host_capsule only: freed with the tensor */
} DpsDLTensor;

long g_test_deleted = 0; /* host test capsules whose deleter ran */

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

PyObject* make_capsule(Handle* owner, void* host_buf, void* ptr, int device_type, int device,
                       DLDataType dt, int ndim, const int64_t* shape) {
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

PyObject* make_tensor(Handle* owner, void* ptr, int device, DLDataType dt, int ndim,
                      const int64_t* shape) {
  if (torch_load() != 0) return NULL;
  PyObject* cap = make_capsule(owner, NULL, ptr, kDLCUDA, device, dt, ndim, shape);
  if (cap == NULL) return NULL;
  PyObject* tensor = PyObject_CallOneArg(t_from_dlpack, cap);
  Py_DECREF(cap); /* consumed by torch (renamed), or freed here through the destructor */
  return tensor;
}

/* ------------------------------------------------------------------------- */
/* DLPack in: torch's C exchange API                                          */

/* DLPack 1.3's DLPackExchangeAPI, which torch (2.10 and later) puts on
 * torch.Tensor as the capsule __dlpack_c_exchange_api__: a table of C
 * functions, one of which fills a non-owning DLTensor of a tensor in one
 * call, where the methods take five (dtype, get_device, shape,
 * is_contiguous, data_ptr), and one of which gives torch's current stream.
 * Only those two are used; the others are opaque here. */
typedef struct {
  uint32_t major, minor;
} DLPackVersion;

typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  struct DLPackExchangeAPIHeader* prev_api; /* an older version's table, or NULL */
} DLPackExchangeAPIHeader;

typedef struct {
  DLPackExchangeAPIHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out); /* may be NULL */
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out); /* may be NULL */
} DLPackExchangeAPI;

#define DPS_EXCHANGE_API_ATTR "__dlpack_c_exchange_api__"
#define DPS_EXCHANGE_API_CAPSULE "dlpack_exchange_api"

static int (*g_dltensor_of)(void*, DLTensor*) = NULL; /* NULL: the methods' path */
static int g_view_on = 1;                            /* _tensor_fast_path(False) clears */
static DLPackVersion g_view_version = {0, 0};
static int (*g_work_stream)(int32_t, int32_t, void**) = NULL; /* NULL: torch's Python call */

/* Whether the table's function reads a known tensor as DLPack says: a
 * [2, 3] int32 CPU tensor, sliced to [2, 2] (strides 3, 1). A table whose
 * layout is not the one above fails this and is not used. */
static int view_self_test(int (*fn)(void*, DLTensor*)) {
  PyObject* t = PyObject_CallFunction(t_empty, "(ii)", 2, 3);
  int ok = 0;
  if (t != NULL) {
    PyObject* i32 = PyObject_CallMethod(t, "to", "O", t_dtypes[DT_I32]);
    PyObject* s = i32 != NULL ? PyObject_CallMethod(i32, "narrow", "(iii)", 1, 0, 2) : NULL;
    DLTensor d;
    memset(&d, 0, sizeof d);
    if (s != NULL && Py_TYPE(s) == t_tensor_type && fn(s, &d) == 0)
      ok = d.ndim == 2 && d.shape != NULL && d.shape[0] == 2 && d.shape[1] == 2 &&
           d.strides != NULL && d.strides[0] == 3 && d.strides[1] == 1 &&
           d.device.device_type == kDLCPU && d.dtype.code == kDLInt && d.dtype.bits == 32 &&
           d.dtype.lanes == 1 && d.data != NULL;
    Py_XDECREF(s);
    Py_XDECREF(i32);
    Py_DECREF(t);
  }
  if (PyErr_Occurred()) PyErr_Clear();
  return ok;
}

void tensor_view_init(void) {
  PyObject* cap = PyObject_GetAttrString((PyObject*)t_tensor_type, DPS_EXCHANGE_API_ATTR);
  if (cap == NULL) { /* torch before 2.10 */
    PyErr_Clear();
    return;
  }
  const DLPackExchangeAPIHeader* h =
      PyCapsule_IsValid(cap, DPS_EXCHANGE_API_CAPSULE)
          ? (const DLPackExchangeAPIHeader*)PyCapsule_GetPointer(cap, DPS_EXCHANGE_API_CAPSULE)
          : NULL;
  /* The table of major version 1 from 1.3 on (the layout above), newest first. */
  while (h != NULL && !(h->version.major == 1 && h->version.minor >= 3)) h = h->prev_api;
  if (h != NULL) {
    const DLPackExchangeAPI* api = (const DLPackExchangeAPI*)h;
    if (api->dltensor_from_py_object_no_sync != NULL &&
        view_self_test(api->dltensor_from_py_object_no_sync)) {
      g_dltensor_of = api->dltensor_from_py_object_no_sync;
      g_view_version = h->version;
      g_work_stream = api->current_work_stream; /* checked against Python at first use */
    }
  }
  Py_DECREF(cap);
  if (PyErr_Occurred()) PyErr_Clear();
}

int tensor_view(PyObject* t, TensorView* v) {
  /* the API takes objects of the type it was found on (not subclasses) */
  if (g_dltensor_of == NULL || !g_view_on || Py_TYPE(t) != t_tensor_type) return 0;
  DLTensor d;
  if (g_dltensor_of(t, &d) != 0) { /* torch refused: its methods will say why, or do it */
    PyErr_Clear();
    return 0;
  }
  v->ptr = (char*)d.data + d.byte_offset;
  v->device = d.device.device_type == kDLCUDA ? d.device.device_id : -1;
  v->ndim = d.ndim;
  v->shape = d.shape;
  v->strides = d.strides;
  v->dtype = d.dtype;
  return 1;
}

int api_current_stream(int device, void** stream) {
  if (g_work_stream == NULL || !g_view_on) return 0;
  if (g_work_stream(kDLCUDA, device, stream) != 0) {
    PyErr_Clear();
    return 0;
  }
  return 1;
}

void api_current_stream_off(void) { g_work_stream = NULL; }

/* _tensor_fast_path(enable=None): whether tensor arguments are read through
 * torch's DLPack C exchange API, and that API's version (None when torch
 * has none); enable=True/False turns it on or off (tests, benchmarks). */
PyObject* tensor_fast_path(PyObject* mod, PyObject* const* args, Py_ssize_t nargs) {
  (void)mod;
  if (nargs > 1) {
    PyErr_SetString(PyExc_TypeError, "_tensor_fast_path() takes at most 1 argument");
    return NULL;
  }
  if (torch_load() != 0) return NULL;
  if (nargs == 1 && args[0] != Py_None) {
    const int on = PyObject_IsTrue(args[0]);
    if (on < 0) return NULL;
    g_view_on = on;
  }
  if (g_dltensor_of == NULL) return Py_BuildValue("(OO)", Py_False, Py_None);
  return Py_BuildValue("(O(II))", g_view_on ? Py_True : Py_False, g_view_version.major,
                       g_view_version.minor);
}

/* ------------------------------------------------------------------------- */
/* Cached output views                                                        */

int view_cache_init(ViewCache* c, int64_t n) {
  memset(c, 0, sizeof *c);
  if (n > VIEW_CACHE_MAX) n = VIEW_CACHE_MAX;
  c->v = PyMem_Calloc((size_t)n, sizeof(PyObject*));
  if (c->v == NULL) return -1;
  c->n = (int)n;
  return 0;
}

PyObject* view_cache_get(ViewCache* c, void* const key[VIEW_CACHE_KEYS], int64_t i) {
  if (memcmp(c->key, key, sizeof c->key) != 0) { /* new buffers: drop stale views */
    view_cache_clear(c);
    memcpy(c->key, key, sizeof c->key);
  }
  if (i < 0 || i >= c->n) return NULL;
  PyObject* v = c->v[i];
  Py_XINCREF(v);
  return v;
}

PyObject* view_cache_put(ViewCache* c, int64_t i, PyObject* v) {
  if (i < 0 || i >= c->n) return v; /* not cached: the stolen reference is the caller's */
  Py_XSETREF(c->v[i], v);
  Py_INCREF(v);
  return v;
}

void view_cache_clear(ViewCache* c) {
  if (c->v == NULL) return;
  for (int i = 0; i < c->n; ++i) Py_CLEAR(c->v[i]);
}

ViewCache view_cache_take(ViewCache* c) {
  ViewCache t = *c;
  memset(c, 0, sizeof *c);
  return t;
}

void view_cache_free(ViewCache* c) {
  view_cache_clear(c);
  PyMem_Free(c->v);
  memset(c, 0, sizeof *c);
}
