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
/* Cached output views                                                        */

int view_cache_init(ViewCache* c, int n) {
  memset(c, 0, sizeof *c);
  c->v = PyMem_Calloc((size_t)n, sizeof(PyObject*));
  if (c->v == NULL) return -1;
  c->n = n;
  return 0;
}

PyObject* view_cache_get(ViewCache* c, void* const key[VIEW_CACHE_KEYS], int i) {
  if (memcmp(c->key, key, sizeof c->key) != 0) { /* new buffers: drop stale views */
    view_cache_clear(c);
    memcpy(c->key, key, sizeof c->key);
  }
  PyObject* v = c->v[i];
  Py_XINCREF(v);
  return v;
}

PyObject* view_cache_put(ViewCache* c, int i, PyObject* v) {
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
