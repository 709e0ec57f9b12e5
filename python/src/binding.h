/* dpsampling._dpsampling: the CPython binding of libdpsampling. Private
 * header of the extension's files (not installed):
 *
 *   module.c       process state, errors, module functions, PyInit
 *   torch.c        torch loaded lazily, its current stream, tensors in
 *   dlpack.c       tensors out (DLPack capsules) and the cached output views
 *   nccl_group.c   NcclGroup: one NCCL communicator per group (SharedNccl)
 *   collectives.c  fallback_comm_backend as a dpsCollectives_t, and the
 *                  library's default collectives object (global_backend)
 *   comm.c         Comm, the base type of dpsampling.DpSamplingComm
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
 *
 * Every name declared here has hidden visibility (the module exports only
 * PyInit__dpsampling).
 */
#ifndef DPS_PY_BINDING_H_
#define DPS_PY_BINDING_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dpsampling.h"

/* ------------------------------------------------------------------------- */
/* Process state and errors (module.c)                                        */

int shutting_down(void); /* _shutdown() ran (registered with atexit) */

/* group registry of the Python layer: dict tuple -> NcclGroup, and a callable
 * group (a tuple of global ranks or a ProcessGroup) -> NcclGroup that
 * bootstraps on a miss */
extern PyObject* g_registry;
extern PyObject* g_resolver;

/* interned names */
extern PyObject* s_dtype;
extern PyObject* s_shape;
extern PyObject* s_get_device;
extern PyObject* s_is_contiguous;
extern PyObject* s_data_ptr;
extern PyObject* s_nbytes;
extern PyObject* s_clone;
extern PyObject* s_cuda_stream;

/* dpsInvalidArgument -> ValueError; everything else -> RuntimeError. */
PyObject* raise_dps(dpsResult_t r);
/* The current exception as one object (cleared), and back (steals e). */
PyObject* err_take(void);
void err_give(PyObject* e);

/* ------------------------------------------------------------------------- */
/* torch (torch.c)                                                            */

/* torch, loaded on first use */
extern PyObject* t_from_dlpack; /* torch._C._from_dlpack */
extern PyObject* t_f32;
extern PyObject* t_bf16;
extern PyObject* t_f16;
extern PyObject* t_i32;
extern PyObject* t_i64;
extern PyObject* t_u8;

int torch_load(void);
/* torch's current stream on `device` (works inside CUDA graph capture). */
int current_stream(int device, void** stream);

typedef struct {
  void* ptr;
  Py_ssize_t ndim;
  int64_t shape[2];
  int64_t nbytes;
} TArg;

/* t.dtype (new reference); TypeError when t is not a tensor. */
PyObject* tensor_dtype(PyObject* t, const char* name);
/* Device, layout and pointer of a tensor argument. want_ndim < 0: any rank
 * (shape not recorded), want_nbytes: also read t.nbytes. */
int tensor_arg(PyObject* t, const char* name, int device, int want_ndim, int want_nbytes,
               TArg* a);
/* Logits dtype of a Python object: None -> unset, a torch dtype (fp32, bf16,
 * fp16) or a name ("fp32", "float32", "torch.float32", ...). -2 (TypeError
 * set) otherwise. */
int dtype_code_of(PyObject* o, int allow_none, const char* name);
/* pad_bs implied by a [pad_bs/tp, ...] input: rows*tp, or -1 (rejected by
 * pad_bs_arg) when that does not fit in an int. */
long inferred_pad_bs(int64_t rows, int tp);
/* pad_bs argument: an int, or None -> `dflt`. */
int pad_bs_arg(PyObject* o, long dflt, int* pad_bs);

/* ------------------------------------------------------------------------- */
/* Refcounted C objects (nccl_group.c: SharedNccl; comm.c: Handle)            */

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

void shared_nccl_retain(SharedNccl* s);
/* Never destroys the NCCL communicator (that is collective: NcclGroup.destroy,
 * called by destroy_group_communicators); a group dropped without it keeps
 * its communicator until the process exits. */
void shared_nccl_release(SharedNccl* s);

typedef struct {
  long refs;
  dpsComm_t comm;
  SharedNccl* nccl;
  int open; /* counted in nccl->open_users */
} Handle;

void handle_retain(Handle* h);
/* Every holder other than the Comm object's own reference is a DLPack tensor
 * or a call in progress (comm_enter). The last one queues the communicator
 * for release: no CUDA or NCCL call, safe inside any capture and on any
 * thread. */
void handle_release(Handle* h);

/* ------------------------------------------------------------------------- */
/* DLPack out (dlpack.c)                                                      */

/* The public DLPack ABI's device and data types (dlpack.c has the rest). */
enum { kDLCPU = 1, kDLCUDA = 2 };                      /* DLDeviceType */
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 }; /* DLDataTypeCode */

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

extern const DLDataType dl_f32;
extern const DLDataType dl_bf16;
extern const DLDataType dl_f16;
extern const DLDataType dl_i32;
extern const DLDataType dl_u8;

extern long g_test_deleted; /* host test capsules whose deleter ran */

DLDataType dl_of_dps(dpsDataType_t t);
/* A "dltensor" capsule over `ptr`, row-major, 1-D or 2-D. It keeps `owner`
 * (may be NULL) alive until the consumer calls the deleter. */
PyObject* make_capsule(Handle* owner, void* host_buf, void* ptr, int device_type, int device,
                       DLDataType dt, int ndim, const int64_t* shape);
/* A torch tensor aliasing `ptr` on cuda:`device`, row-major, 1-D or 2-D.
 * The tensor keeps `owner` alive. */
PyObject* make_tensor(Handle* owner, void* ptr, int device, DLDataType dt, int ndim,
                      const int64_t* shape);

/* Cached output views of one operation, indexed by pad_bs (0..n-1): the
 * outputs are persistent buffers, so the views made for a pad_bs serve every
 * later call with it. `key` holds the buffers they alias (unused entries
 * NULL); when an operation returns other buffers (never expected) the stale
 * views are dropped. Used with the GIL held. */
#define VIEW_CACHE_KEYS 3
typedef struct {
  PyObject** v; /* [n]; NULL entries: not made yet */
  int n;
  void* key[VIEW_CACHE_KEYS];
} ViewCache;

/* n entries, all empty; -1 (no exception set) when out of memory. */
int view_cache_init(ViewCache* c, int n);
/* The view for pad_bs i over the buffers `key` (a new reference), or NULL
 * (no exception set) when none is cached; drops stale views first. */
PyObject* view_cache_get(ViewCache* c, void* const key[VIEW_CACHE_KEYS], int i);
/* Caches v (stolen) for pad_bs i; returns a new reference to it. */
PyObject* view_cache_put(ViewCache* c, int i, PyObject* v);
/* Drops every view (may run Python code: a view's deleter). */
void view_cache_clear(ViewCache* c);
/* Moves the cache out of *c (left empty), so that the caller can drop it
 * after the object no longer points at it. */
ViewCache view_cache_take(ViewCache* c);
/* view_cache_clear, then frees the array; c is left empty. */
void view_cache_free(ViewCache* c);

/* ------------------------------------------------------------------------- */
/* Device guard                                                               */

typedef struct {
  int prev, switched;
} DevGuard;

static inline cudaError_t dev_enter(DevGuard* g, int device) {
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

static inline void dev_leave(DevGuard* g) {
  if (g->switched) (void)cudaSetDevice(g->prev);
}

/* ------------------------------------------------------------------------- */
/* NcclGroup (nccl_group.c)                                                   */

typedef struct {
  PyObject_HEAD SharedNccl* s;
  int initializing; /* ncclCommInitRank in progress without the GIL (GIL-protected) */
} NcclGroupObject;

extern PyTypeObject NcclGroupType;

/* The group's NcclGroup: the registry first, then the Python resolver. */
NcclGroupObject* lookup_group(PyObject* group);

/* ------------------------------------------------------------------------- */
/* Collectives (collectives.c)                                                */

/* Python collectives (fallback_comm_backend) as a dpsCollectives_t. */
typedef struct {
  PyObject* backend; /* object with all_gather_into_tensor / all_to_all_single */
  PyObject* group;   /* passed as group=: the ProcessGroup or tuple of global ranks given */
  Handle* owner;     /* borrowed: the Comm object outlives its adapter's use */
  int device, tp;
  PyObject* exc; /* exception raised inside a callback, re-raised by the op */
} Adapter;

void adapter_free(Adapter* a);
dpsResult_t adapter_all_gather(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                               struct CUstream_st* stream);
dpsResult_t adapter_all_to_all(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                               struct CUstream_st* stream);

/* The library's default collectives object (get_global_backend()). */
typedef struct {
  PyObject_HEAD
} BackendObject;

extern PyTypeObject BackendType;

/* ------------------------------------------------------------------------- */
/* Comm (comm.c)                                                              */

extern PyTypeObject CommType;

#endif /* DPS_PY_BINDING_H_ */
