/* dpsampling._dpsampling: the CPython binding of libdpsampling. Private
 * header of the extension's files (not installed):
 *
 *   module.c       process state, errors, module functions, PyInit
 *   dtype.c        the one table of tensor dtypes (torch, library, DLPack,
 *                  sizes, names) and the dtype checks of arguments
 *   torch.c        torch loaded lazily, its current stream, tensors in, the
 *                  methods' argument parser (fast_args)
 *   dlpack.c       tensors out (DLPack capsules) and the cached output views
 *   nccl_group.c   NcclGroup: one NCCL communicator per group (SharedNccl)
 *   collectives.c  fallback_comm_backend as a dpsCollectives_t, and the
 *                  library's default collectives object (global_backend)
 *   comm.c         Comm, the base type of dpsampling.DpSamplingComm: its
 *                  lifecycle, the protocol of a call, the queries, Handle
 *   ops.c          Comm's swap, gathers, argmax and topk; output views and
 *                  the persistent outputs of argmax, topk and sample
 *   sample.c       Comm's sample and verify_chain and their parameters
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
extern PyObject* s_view;
extern PyObject* s_cuda_stream;

/* dpsInvalidArgument -> ValueError; everything else -> RuntimeError. */
PyObject* raise_dps(dpsResult_t r);
/* The current exception as one object (cleared), and back (steals e). */
PyObject* err_take(void);
void err_give(PyObject* e);

/* ------------------------------------------------------------------------- */
/* Tensor dtypes (dtype.c): the one table of every dtype the binding handles   */

/* The public DLPack ABI's device and data types (dlpack.c has the rest). */
enum { kDLCPU = 1, kDLCUDA = 2 };                      /* DLDeviceType */
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 }; /* DLDataTypeCode */

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

/* Rows of the table; the first three are the logits dtypes, in the order of
 * their library codes' names in messages. */
typedef enum { DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64, DT_U8, DT_COUNT } Dt;

typedef struct {
  const char* torch_name;  /* "torch.float32": torch's attribute after the prefix */
  dpsDataType_t code;      /* the library's code; dpsDtypeUnset: not a logits dtype */
  DLDataType dl;           /* the DLPack type of the binding's output views */
  int size;                /* bytes per element */
  const char* names[4];    /* logits dtypes: the names dtype_code_of takes (NULL-ended) */
} DtypeInfo;

extern const DtypeInfo g_dtypes[DT_COUNT];
/* torch.<name> of each row, set by torch_load() (borrowed from torch) */
extern PyObject* t_dtypes[DT_COUNT];

/* The row of a library code (dpsFloat32/dpsBfloat16/dpsFloat16), or -1. */
int dt_of_code(dpsDataType_t code);
/* The row of a torch dtype object (after torch_load), or -1. */
int dt_of_torch(PyObject* dtype);
/* The row of a DLPack type, or -1. */
int dt_of_dl(DLDataType d);
/* A set of rows, for tensor_arg. */
#define DT_BIT(dt) (1u << (dt))
#define DT_LOGITS (DT_BIT(DT_F32) | DT_BIT(DT_BF16) | DT_BIT(DT_F16))

/* ------------------------------------------------------------------------- */
/* torch (torch.c)                                                            */

/* torch, loaded on first use */
extern PyObject* t_from_dlpack; /* torch._C._from_dlpack */
extern PyObject* t_empty;       /* torch.empty */
extern PyTypeObject* t_tensor_type; /* torch.Tensor (NULL until torch_load) */

/* Whether o is a torch.Tensor (or a subclass): after torch_load only; before,
 * 0 (the callers then take their general path). */
static inline int is_tensor(PyObject* o) {
  return t_tensor_type != NULL && PyObject_TypeCheck(o, t_tensor_type);
}

int torch_load(void);
/* torch's current stream on `device` (works inside CUDA graph capture). */
int current_stream(int device, void** stream);

typedef struct {
  void* ptr;
  Py_ssize_t ndim;
  int64_t shape[2];
  int64_t nbytes;
  int dt; /* the dtype's row, -1 when not in the table (read when tensor_arg is given dts) */
} TArg;

/* A tensor as torch's DLPack C exchange API sees it (dlpack.c): borrowed
 * from the tensor, valid until Python code runs. */
typedef struct {
  void* ptr;              /* the first element */
  int device;             /* the CUDA device, -1 when not on one */
  int ndim;
  const int64_t* shape;
  const int64_t* strides; /* in elements; NULL: compact row-major */
  DLDataType dtype;
} TensorView;

/* After torch_load has torch.Tensor: looks for torch's exchange API. */
void tensor_view_init(void);
/* 1 with *v filled when t is exactly a torch.Tensor and the API read it; 0
 * when the caller must ask the tensor's methods instead. */
int tensor_view(PyObject* t, TensorView* v);
/* 1 with *stream set to torch's current stream on `device` from the same
 * API; 0 when the caller must ask torch's Python functions (no API, the
 * API refused, or the fast path switched off). api_current_stream_off()
 * stops its use (current_stream found it disagreeing with Python). */
int api_current_stream(int device, void** stream);
void api_current_stream_off(void);
PyObject* tensor_fast_path(PyObject* mod, PyObject* const* args, Py_ssize_t nargs);
PyObject* m_current_stream(PyObject* mod, PyObject* dev);

/* The table row of t.dtype: -1 for a dtype not in the table, -2 (TypeError
 * set, naming `name`) when t is not a tensor (dtype.c). */
int tensor_dt(PyObject* t, const char* name);
/* -1 with a TypeError naming `name`, the dtype wanted and t's (tensor_arg
 * returned TARG_DTYPE). */
int dtype_error(PyObject* t, const char* name, Dt want);
/* -1 with a TypeError naming `name`, t's dtype and the logits dtypes. */
int logits_dtype_error(PyObject* t, const char* name);
/* Dtype, device, layout and pointer of a tensor argument, checked in that
 * order. dts: the rows its dtype may take (DT_BIT()s ORed; 0: any, not
 * read); want_ndim < 0: any rank (shape not recorded); want_nbytes: also its
 * size in bytes. 0; -1 with an exception set; or TARG_DTYPE, no exception
 * set, when the dtype is not one of dts (a->dt has it): the caller says what
 * it wanted. */
enum { TARG_DTYPE = -2 };
int tensor_arg(PyObject* t, const char* name, int device, unsigned dts, int want_ndim,
               int want_nbytes, TArg* a);
/* tensor_arg of dtype `want` exactly, with dtype_error's message otherwise. */
int typed_arg(PyObject* t, const char* name, int device, Dt want, int want_ndim, int want_nbytes,
              TArg* a);
/* Logits dtype of a Python object: None -> unset, a torch dtype (fp32, bf16,
 * fp16) or one of the table's names, with or without a "torch." prefix
 * (dtype.c). -2 (TypeError set) otherwise. */
int dtype_code_of(PyObject* o, int allow_none, const char* name);
/* pad_bs implied by a [pad_bs/tp, ...] input: rows*tp, or -1 (rejected by
 * pad_bs_arg) when that does not fit in an int. */
long inferred_pad_bs(int64_t rows, int tp);
/* pad_bs argument: an int, or None -> `dflt`. */
int pad_bs_arg(PyObject* o, long dflt, int* pad_bs);

/* A PyMethodDef entry of a METH_FASTCALL | METH_KEYWORDS method. */
#define KW_METHOD(name, fn, doc) \
  { name, (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS, doc }

/* Argument parsing of a METH_FASTCALL | METH_KEYWORDS method `fname` whose
 * parameters are `names` (NULL-ended; the first nreq required): out[i] is
 * the argument (borrowed) or NULL when not given. 0, or -1 with TypeError. */
int fast_args(const char* fname, const char* const* names, int nreq, PyObject* const* args,
              Py_ssize_t nargs, PyObject* kwnames, PyObject** out);
/* fast_args where only the first npos parameters may be given by position
 * (the rest keyword-only). */
int fast_args_pos(const char* fname, const char* const* names, int nreq, int npos,
                  PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out);
/* A required parameter i that may also be given as names[alias] (keyword
 * only; parsed with nreq short of i): out[i] takes out[alias]. 0, or -1 with
 * TypeError when both are given or neither. */
int fast_alias(const char* fname, const char* const* names, PyObject** out, int i, int alias);

/* The package's argument normalizers (dpsampling/__init__.py registers them
 * with _set_arg_helpers): the public methods argmax, topk, sample and
 * verify_chain take their common argument types in C and hand anything else
 * to these, which raise the package's errors or return the normalized
 * values (module.c). helper(name) is borrowed, or NULL with RuntimeError
 * when none is registered. */
extern PyObject* g_arg_helpers;
PyObject* arg_helper(const char* name);

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

extern long g_test_deleted; /* host test capsules whose deleter ran */

/* A "dltensor" capsule over `ptr`, row-major, 1-D or 2-D. It keeps `owner`
 * (may be NULL) alive until the consumer calls the deleter. */
PyObject* make_capsule(Handle* owner, void* host_buf, void* ptr, int device_type, int device,
                       DLDataType dt, int ndim, const int64_t* shape);
/* A torch tensor aliasing `ptr` on cuda:`device`, row-major, 1-D or 2-D.
 * The tensor keeps `owner` alive. */
PyObject* make_tensor(Handle* owner, void* ptr, int device, DLDataType dt, int ndim,
                      const int64_t* shape);

/* Cached output views of one operation, indexed by pad_bs or rows (0..n-1):
 * the outputs are persistent buffers, so the views made for a size serve
 * every later call with it. `key` holds the buffers they alias (unused
 * entries NULL); when an operation returns other buffers (never expected) the
 * stale views are dropped. Sizes from VIEW_CACHE_MAX up are not cached (a
 * new view each call) so that the array stays small for any configuration.
 * Used with the GIL held. */
#define VIEW_CACHE_KEYS 3
#define VIEW_CACHE_MAX 65536
typedef struct {
  PyObject** v; /* [n]; NULL entries: not made yet */
  int n;
  void* key[VIEW_CACHE_KEYS];
} ViewCache;

/* min(n, VIEW_CACHE_MAX) entries, all empty; -1 (no exception set) when out
 * of memory. */
int view_cache_init(ViewCache* c, int64_t n);
/* The view for size i over the buffers `key` (a new reference), or NULL (no
 * exception set) when none is cached; drops stale views first. */
PyObject* view_cache_get(ViewCache* c, void* const key[VIEW_CACHE_KEYS], int64_t i);
/* Caches v (stolen) for size i where the cache has an entry for it; returns
 * a new reference to v. */
PyObject* view_cache_put(ViewCache* c, int64_t i, PyObject* v);
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
/* Comm: lifecycle (comm.c), operations (ops.c, sample.c)                     */

extern PyTypeObject CommType;

/* The operations whose outputs are handed out as cached views of the
 * library's persistent buffers. */
enum {
  V_SWAP,      /* swap_batch_vocab: the [pad_bs/tp*N, V] tensor */
  V_GATHER,    /* gather_verify_outputs: tuples (predict, accept_index, accept_length) */
  V_LOGPROB,   /* gather_verify_logprobs: the [pad_bs, N] tensor */
  V_VERIFY,    /* verify_chain: tuples (predict, accept_index, accept_length) */
  V_VERIFY_LP, /* verify_chain: its logprobs [pad_bs, N] */
  V_COUNT
};

/* The binding's own persistent outputs of the operations that write the
 * caller's buffers (argmax, topk, sample), used when the caller passes none:
 * one torch uint8 tensor per slot, allocated by the first call that needs it
 * at the slot's largest size (it never moves), and views of it cached per row
 * count. */
enum {
  O_ARGMAX_VALUE,
  O_ARGMAX_INDEX,
  O_ARGMAX_LSE,
  O_TOPK_VALUES,
  O_TOPK_INDICES,
  O_SAMPLE_TOKENS,
  O_SAMPLE_LOGPROBS,
  O_COUNT
};

typedef struct {
  PyObject* base;  /* uint8 [bytes] on the communicator's device, or NULL */
  int64_t bytes;
  void* ptr;       /* base.data_ptr() */
  ViewCache views; /* [rows] views of base, keyed by (base, dtype, k) */
} OutSlot;

/* A call in progress and the GIL: see comm.c ("A call in progress"). */
typedef struct {
  PyObject_HEAD Handle* h;
  int device, tp, n, max_pad_bs;
  int64_t vocab;
  /* cached output views of each operation, indexed by pad_bs (0..max_pad_bs) */
  ViewCache views[V_COUNT];
  OutSlot outs[O_COUNT]; /* persistent outputs of argmax, topk, sample */
  Adapter* adapter;
  const char* busy;   /* name of the call in progress, or NULL (comm.c) */
  dpsCommInfo_t info; /* snapshot for the getters while busy */
  int may_block;      /* dpsCommOpMayBlock as of the same moment (op_launch) */
  uint64_t invalid_seen; /* sample_stats: invalid_calls at the previous read */
} CommObject;

/* The body of an operation: runs between comm_enter and comm_leave, with a
 * reference to the handle; `a` holds the method's arguments (NULL: not
 * given). */
typedef PyObject* (*OpBody)(CommObject* self, Handle* h, PyObject* const* a);
/* Starts the call `op`, runs body, ends the call (comm.c). */
PyObject* comm_run(CommObject* self, const char* op, OpBody body, PyObject* const* a);

/* The library call of an operation, made by op_launch with the stream. */
typedef dpsResult_t (*OpCall)(dpsComm_t comm, void* ctx, struct CUstream_st* stream);
/* torch's current stream, then call(comm, ctx, stream), without the GIL when
 * the library says it may block. 0, or -1 with the exception set (the
 * library's, or the one a fallback_comm_backend callback raised). */
int op_launch(CommObject* self, Handle* h, OpCall call, void* ctx);

/* The operations' methods (ops.c, sample.c), listed in CommType's table. */
PyObject* comm_swap(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw);
PyObject* comm_swap_new(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw);
PyObject* comm_gather_outputs(CommObject* self, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kw);
PyObject* comm_gather_logprobs(CommObject* self, PyObject* const* args, Py_ssize_t nargs,
                               PyObject* kw);
PyObject* comm_select(CommObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* comm_argmax(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw);
PyObject* comm_topk(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw);
PyObject* comm_sample_m(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw);
PyObject* comm_verify_chain_m(CommObject* self, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kw);
extern const char doc_argmax[], doc_topk[], doc_sample[], doc_verify_chain[];
/* Module functions of the CPU tests: sample()'s and verify_chain()'s
 * arguments as the methods normalize them (sample.c). */
PyObject* m_test_sample_args(PyObject* m, PyObject* const* args, Py_ssize_t nargs, PyObject* kw);
PyObject* m_test_verify_args(PyObject* m, PyObject* const* args, Py_ssize_t nargs, PyObject* kw);
/* vocab_limit for _select / _sample / _verify_chain (a new reference): None -> 0,
 * an int >= 1 as it is, else the package's _limit_arg (ops.c). */
PyObject* limit_value(PyObject* o);
PyObject* comm_sample(CommObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* comm_verify_chain(CommObject* self, PyObject* const* args, Py_ssize_t nargs);

/* Shared by the operations (ops.c). */
/* local_logits: a 2-D contiguous tensor of a logits dtype on the
 * communicator's device; *dt its table row. */
int logits_arg(CommObject* self, PyObject* x, int* dt, TArg* a);
/* An output tensor given by the caller (t a tensor: dtype `want`,
 * contiguous, on the device, exactly rows*max(k,1) elements), or (t NULL or
 * None) the persistent slot's view [rows] (k == 0) or [rows, k]. *res gets a
 * new reference to the tensor and *ptr its data pointer; rows outside
 * [1, max_pad_bs*N] give None and NULL, for the library to refuse. */
int out_tensor(CommObject* self, PyObject* t, const char* name, int slot, Dt want, int64_t rows,
               int k, PyObject** res, void** ptr);
/* The full-batch verify outputs as cached views: (predict, accept_index,
 * accept_length) of operation `which`, and the logprobs [pad_bs, N]. */
PyObject* outputs_view(CommObject* self, Handle* h, int which, int32_t* po, int32_t* aio,
                       int32_t* alo, int pad_bs);
PyObject* logprobs_view(CommObject* self, Handle* h, int which, float* out, int pad_bs);
/* The slots' views and bases, dropped (comm.c's release). */
void out_slots_free(OutSlot* slots);

#endif /* DPS_PY_BINDING_H_ */
