/* Comm: the base type of dpsampling.DpSamplingComm (one dpsComm_t), and the
 * refcounted Handle that its tensors share. */
#include "binding.h"

/* ------------------------------------------------------------------------- */
/* Handle                                                                     */

void handle_retain(Handle* h) { __atomic_add_fetch(&h->refs, 1, __ATOMIC_RELAXED); }

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

void handle_release(Handle* h) {
  if (h == NULL) return;
  if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  (void)dpsCommRelease(h->comm);
  shared_nccl_release(h->nccl);
  free(h);
}

/* ------------------------------------------------------------------------- */
/* Comm: base type of dpsampling.DpSamplingComm                               */

/* The operations whose outputs are handed out as cached views. */
enum {
  V_SWAP,    /* swap_batch_vocab: the [pad_bs/tp*N, V] tensor */
  V_GATHER,  /* gather_verify_outputs: tuples (predict, accept_index, accept_length) */
  V_LOGPROB, /* gather_verify_logprobs: the [pad_bs, N] tensor */
  V_VERIFY,  /* verify_chain: tuples (predict, accept_index, accept_length) */
  V_VERIFY_LP, /* verify_chain: its logprobs [pad_bs, N] */
  V_COUNT
};

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
  /* cached output views of each operation, indexed by pad_bs (0..max_pad_bs) */
  ViewCache views[V_COUNT];
  Adapter* adapter;
  const char* busy;   /* name of the call in progress, or NULL (see above) */
  dpsCommInfo_t info; /* snapshot for the getters while busy */
  int may_block;      /* dpsCommOpMayBlock as of the same moment (op_gil_drop) */
  uint64_t invalid_seen; /* sample_stats: invalid_calls at the previous read */
} CommObject;

static void free_views(ViewCache* views) {
  for (int i = 0; i < V_COUNT; ++i) view_cache_free(&views[i]);
}

/* Takes everything off the object first, then lets it go: dropping a view or
 * the adapter's objects can run Python code, which then finds the object
 * closed, and the last handle reference destroys without the GIL. Callers
 * make sure no call is in progress (busy == NULL). */
static void comm_release(CommObject* self) {
  ViewCache views[V_COUNT];
  for (int i = 0; i < V_COUNT; ++i) views[i] = view_cache_take(&self->views[i]);
  Adapter* a = self->adapter;
  Handle* h = self->h;
  self->adapter = NULL;
  self->h = NULL;
  if (a != NULL && h != NULL) (void)dpsCommSetCollectives(h->comm, NULL);
  free_views(views);
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
 * GIL to reach the same collective. The library says which calls may
 * (dpsCommOpMayBlock: e.g. the first swap prepares, which is collective, and
 * NCCL's enqueue may set up connections with the peers). A call that only
 * launches a kernel keeps the GIL: that avoids handing it to another thread
 * for a call of a few microseconds, since getting it back can take the
 * interpreter's switch interval (5 ms by default). */
static PyThreadState* op_gil_drop(const CommObject* self) {
  return self->may_block ? PyEval_SaveThread() : NULL; /* give back with gil_take() */
}

/* The state as of the end of a call: the getters' snapshot, and whether the
 * next operation may block (if the library cannot say, assume it may). */
static void comm_snapshot(CommObject* self, dpsComm_t comm) {
  (void)dpsCommGetInfo(comm, &self->info);
  if (dpsCommOpMayBlock(comm, &self->may_block) != dpsSuccess) self->may_block = 1;
}

/* Ends the call. Raise before leaving: the handle reference is dropped here
 * (never the last one, as close() waits for the call, but keep it so). */
static void comm_leave(CommObject* self, Handle* h) {
  if (h != NULL) comm_snapshot(self, h->comm);
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
  ViewCache views[V_COUNT];
  memset(views, 0, sizeof views);
  int nomem = h == NULL;
  for (int i = 0; i < V_COUNT && !nomem; ++i)
    nomem = view_cache_init(&views[i], max_pad_bs + 1) != 0;
  if (nomem) {
    free(h);
    free_views(views);
    return PyErr_NoMemory();
  }
  if (comm_enter(self, "_create", NULL) != 0) { /* cannot fail: checked above */
    free(h);
    free_views(views);
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
    free_views(views);
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
  memcpy(self->views, views, sizeof views);
  comm_snapshot(self, comm);
  comm_leave(self, NULL);
  Py_RETURN_NONE;
}

/* _set_collectives(backend_or_None, group) -> None, or the library's message
 * (a str) when the communicator's backend uses no collectives (nothing is
 * installed then; the previous adapter stays) */
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
  if (r == dpsUnavailable) { /* the backend uses no collectives: the caller says so */
    adapter_free(a);
    return PyUnicode_FromString(dpsGetLastError());
  }
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
  void* key[VIEW_CACHE_KEYS] = {out};
  PyObject* v = view_cache_get(&self->views[V_SWAP], key, pad_bs);
  if (v != NULL) return v;
  int64_t shape[2] = {(int64_t)(pad_bs / self->tp) * self->n, self->vocab};
  v = make_tensor(h, out, self->device, dl_of_dps(dt), 2, shape);
  if (v == NULL) return NULL;
  return view_cache_put(&self->views[V_SWAP], pad_bs, v);
}

/* local_logits' torch dtype (new reference) and its code; TypeError (NULL)
 * for a dtype the library does not take. */
static PyObject* logits_dtype(PyObject* x, dpsDataType_t* code) {
  PyObject* dt = tensor_dtype(x, "local_logits");
  if (dt == NULL) return NULL;
  *code = dt == t_f32 ? dpsFloat32 : dt == t_bf16 ? dpsBfloat16 : dt == t_f16 ? dpsFloat16 : dpsDtypeUnset;
  if (*code == dpsDtypeUnset) {
    PyErr_Format(PyExc_TypeError,
                 "local_logits dtype %R is not supported; expected torch.float32, torch.bfloat16 "
                 "or torch.float16",
                 dt);
    Py_DECREF(dt);
    return NULL;
  }
  return dt;
}

/* local_logits of swap, sample and verify_chain: a supported dtype (*code),
 * 2-D, contiguous, on the communicator's device. */
static int logits_arg(CommObject* self, PyObject* x, dpsDataType_t* code, TArg* a) {
  PyObject* dt = logits_dtype(x, code);
  if (dt == NULL) return -1;
  Py_DECREF(dt);
  return tensor_arg(x, "local_logits", self->device, 2, 0, a);
}

static PyObject* swap_body(CommObject* self, Handle* h, PyObject* x, PyObject* pad_obj) {
  if (torch_load() != 0) return NULL;
  dpsDataType_t code;
  TArg a;
  if (logits_arg(self, x, &code, &a) != 0) return NULL;
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

/* The full-batch verify outputs (persistent buffers) as the cached views
 * of operation `which`: (predict [pad_bs, N], accept_index [pad_bs, N],
 * accept_length [pad_bs]), int32 (gather_verify_outputs, verify_chain). */
static PyObject* outputs_view(CommObject* self, Handle* h, int which, int32_t* po, int32_t* aio,
                              int32_t* alo, int pad_bs) {
  void* key[VIEW_CACHE_KEYS] = {po, aio, alo};
  PyObject* v = view_cache_get(&self->views[which], key, pad_bs);
  if (v != NULL) return v;
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
  return view_cache_put(&self->views[which], pad_bs, v);
}

/* The full-batch logprobs fp32 [pad_bs, N] (a persistent buffer) as the
 * cached view of operation `which` (gather_verify_logprobs, verify_chain). */
static PyObject* logprobs_view(CommObject* self, Handle* h, int which, float* out, int pad_bs) {
  void* key[VIEW_CACHE_KEYS] = {out};
  PyObject* v = view_cache_get(&self->views[which], key, pad_bs);
  if (v != NULL) return v;
  int64_t s2[2] = {pad_bs, self->n};
  v = make_tensor(h, out, self->device, dl_f32, 2, s2);
  if (v == NULL) return NULL;
  return view_cache_put(&self->views[which], pad_bs, v);
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
  return outputs_view(self, h, V_GATHER, po, aio, alo, pad_bs);
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
  return logprobs_view(self, h, V_LOGPROB, out, pad_bs);
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

/* _select(logits, k, vocab_limit, value, index, lse): dpsArgmax (k < 0) or
 * dpsTopK (k >= 0: the library checks k) into the caller's tensors (the
 * Python methods make them); values first, then indices, as in the C API. */
static int select_out(PyObject* t, const char* name, PyObject* want_dt, const char* want_name,
                      int device, int64_t rows, int k, void** ptr) {
  *ptr = NULL;
  if (t == Py_None) return 0;
  if (expect_dtype(t, name, want_dt, want_name) != 0) return -1;
  TArg a;
  if (tensor_arg(t, name, device, -1, 1, &a) != 0) return -1;
  const int64_t elems = rows * (k >= 0 ? k : 1);
  const int64_t esize = want_dt == t_i64 ? 8 : want_dt == t_f32 ? 4 : 2;
  if (a.nbytes != elems * esize) {
    PyErr_Format(PyExc_ValueError, "%s must hold %lld elements ([%lld%s]), got %lld bytes", name,
                 (long long)elems, (long long)rows, k >= 0 ? ", k" : "", (long long)a.nbytes);
    return -1;
  }
  *ptr = a.ptr;
  return 0;
}

static PyObject* select_body(CommObject* self, Handle* h, PyObject* x, int k, long long limit,
                             PyObject* ov, PyObject* oi, PyObject* ol) {
  if (torch_load() != 0) return NULL;
  dpsDataType_t code;
  PyObject* dt = logits_dtype(x, &code);
  if (dt == NULL) return NULL;
  const char* dname = code == dpsFloat32    ? "torch.float32"
                      : code == dpsBfloat16 ? "torch.bfloat16"
                                            : "torch.float16";
  TArg a;
  if (tensor_arg(x, "local_logits", self->device, 2, 0, &a) != 0) {
    Py_DECREF(dt);
    return NULL;
  }
  void *pv, *pi, *pl;
  const int bad = select_out(ov, k >= 0 ? "out_values" : "out_value", dt, dname, self->device,
                             a.shape[0], k, &pv) ||
                  select_out(oi, k >= 0 ? "out_indices" : "out_index", t_i64, "torch.int64",
                             self->device, a.shape[0], k, &pi) ||
                  select_out(ol, "out_lse", t_f32, "torch.float32", self->device, a.shape[0], -1,
                             &pl);
  Py_DECREF(dt);
  if (bad) return NULL;
  void* stream;
  if (current_stream(self->device, &stream) != 0) return NULL;
  adapter_reset(self);
  dpsComm_t comm = h->comm;
  const int64_t vlimit = limit > 0 ? (int64_t)limit : self->vocab;
  dpsResult_t r;
  PyThreadState* ts = op_gil_drop(self);
  if (k < 0)
    r = dpsArgmax(comm, a.ptr, a.shape[0], a.shape[1], code, vlimit, pv, (int64_t*)pi,
                  (float*)pl, (struct CUstream_st*)stream);
  else
    r = dpsTopK(comm, a.ptr, a.shape[0], a.shape[1], code, k, vlimit, pv, (int64_t*)pi,
                (struct CUstream_st*)stream);
  gil_take(ts);
  if (r != dpsSuccess) return op_fail(self, r);
  Py_RETURN_NONE;
}

static PyObject* comm_select(CommObject* self, PyObject* args) {
  PyObject *x, *ov, *oi, *ol;
  int k;
  long long limit;
  if (!PyArg_ParseTuple(args, "OiLOOO:_select", &x, &k, &limit, &ov, &oi, &ol)) return NULL;
  Handle* h;
  if (comm_enter(self, k >= 0 ? "topk" : "argmax", &h) != 0) return NULL;
  PyObject* v = select_body(self, h, x, k, limit, ov, oi, ol);
  comm_leave(self, h);
  return v;
}

/* _sample(logits, vocab_limit, temperature, top_k, top_p, min_p, seed, offset,
 *         tokens, logprobs): dpsSample into the caller's tensors (the Python
 * method makes them). Each parameter is a Python number, the scalar for every
 * row (sample() has normalized it: float for temperature, top_p and min_p, int
 * for top_k, an int in [0, 2^64) for seed and offset), or a tensor [rows]
 * whose device pointer goes into the params' array field. The scalars' ranges
 * are the library's to check (dpsInvalidArgument names the argument). */

/* The length of a parameter tensor: one entry per row (sample: `n` rows of
 * local_logits) or per request (verify_chain: n == pad_bs). */
typedef enum { PER_ROW, PER_REQUEST } ParamsPer;

/* One tensor parameter: dtype (want, or alt when alt != NULL), 1-D, `n`
 * long, contiguous, on the communicator's device. *is_alt says which dtype. */
static int sample_array(PyObject* t, const char* name, PyObject* want, PyObject* alt,
                        const char* want_names, int device, int64_t n, ParamsPer per,
                        const void** ptr, int* is_alt) {
  const char* dim = per == PER_ROW ? "rows" : "pad_bs";
  PyObject* dt = tensor_dtype(t, name);
  if (dt == NULL) return -1;
  const int ok = dt == want || (alt != NULL && dt == alt);
  if (!ok) {
    PyErr_Format(PyExc_TypeError, "%s must be a Python number or a %s tensor [%s], got %R",
                 name, want_names, dim, dt);
    Py_DECREF(dt);
    return -1;
  }
  if (is_alt != NULL) *is_alt = alt != NULL && dt == alt;
  Py_DECREF(dt);
  TArg a;
  if (tensor_arg(t, name, device, 1, 0, &a) != 0) return -1;
  if (a.shape[0] != n) {
    if (per == PER_ROW)
      PyErr_Format(PyExc_ValueError,
                   "%s has shape [%lld] but local_logits has %lld rows (one value per row)", name,
                   (long long)a.shape[0], (long long)n);
    else
      PyErr_Format(PyExc_ValueError,
                   "%s has shape [%lld] but pad_bs=%lld (one value per request)", name,
                   (long long)a.shape[0], (long long)n);
    return -1;
  }
  *ptr = a.ptr;
  return 0;
}

/* Python's scalar for every row: a float (temperature, top_p, min_p). 1 if o
 * is one (written to *v), 0 if it is not a number (a tensor), -1 on error. */
static int sample_float(PyObject* o, float* v) {
  if (!PyFloat_Check(o) && !PyLong_Check(o)) return 0;
  const double d = PyFloat_AsDouble(o);
  if (d == -1.0 && PyErr_Occurred()) return -1;
  *v = (float)d; /* out of fp32 range becomes inf: the library refuses it by name */
  return 1;
}

/* The sampling parameters of sample and verify_chain into *p:
 * q = (temperature, top_k, top_p, min_p, seed, offset), each a Python number
 * (the scalar) or a tensor of n entries (its device pointer). */
static int sample_params(PyObject* const* q, int dev, int64_t n, ParamsPer per,
                         dpsSampleParams_t* p) {
  enum { TEMP, TOPK, TOPP, MINP, SEED, OFFSET };
  const void* arr;
  int alt, r;
  /* float parameters: a number -> the scalar, else a float32 tensor */
  static const char* const fnames[3] = {"temperature", "top_p", "min_p"};
  const int fidx[3] = {TEMP, TOPP, MINP};
  float* fscalar[3] = {&p->temperature, &p->top_p, &p->min_p};
  const float** farray[3] = {&p->temperatures, &p->top_ps, &p->min_ps};
  for (int i = 0; i < 3; ++i) {
    if ((r = sample_float(q[fidx[i]], fscalar[i])) < 0) return -1;
    if (r == 0) {
      if (sample_array(q[fidx[i]], fnames[i], t_f32, NULL, "torch.float32", dev, n, per, &arr,
                       NULL) != 0)
        return -1;
      *farray[i] = (const float*)arr;
    }
  }
  if (PyLong_Check(q[TOPK])) {
    p->top_k = (int64_t)PyLong_AsLongLong(q[TOPK]);
    if (p->top_k == -1 && PyErr_Occurred()) return -1;
  } else {
    if (sample_array(q[TOPK], "top_k", t_i32, t_i64, "torch.int32 or torch.int64", dev, n, per,
                     &arr, &alt) != 0)
      return -1;
    if (alt)
      p->top_ks_i64 = (const int64_t*)arr;
    else
      p->top_ks = (const int32_t*)arr;
  }
  /* seed, offset: uint64; a tensor is int64 and its bits are the values */
  static const char* const unames[2] = {"seed", "offset"};
  uint64_t* uscalar[2] = {&p->seed, &p->offset};
  const uint64_t** uarray[2] = {&p->seeds, &p->offsets};
  for (int i = 0; i < 2; ++i) {
    PyObject* u = q[SEED + i];
    if (PyLong_Check(u)) {
      *uscalar[i] = (uint64_t)PyLong_AsUnsignedLongLong(u);
      if (*uscalar[i] == (uint64_t)-1 && PyErr_Occurred()) return -1;
    } else {
      if (sample_array(u, unames[i], t_i64, NULL, "torch.int64", dev, n, per, &arr, NULL) != 0)
        return -1;
      *uarray[i] = (const uint64_t*)arr;
    }
  }
  return 0;
}

static PyObject* sample_body(CommObject* self, Handle* h, PyObject* const* o, long long limit) {
  enum { X, TEMP, TOPK, TOPP, MINP, SEED, OFFSET, TOKENS, LOGPROBS };
  if (torch_load() != 0) return NULL;
  dpsDataType_t code;
  TArg a;
  if (logits_arg(self, o[X], &code, &a) != 0) return NULL;
  const int64_t rows = a.shape[0];
  const int dev = self->device;
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  if (sample_params(&o[TEMP], dev, rows, PER_ROW, &p) != 0) return NULL;
  void *pt, *pl;
  if (select_out(o[TOKENS], "out", t_i64, "torch.int64", dev, rows, -1, &pt) != 0 ||
      select_out(o[LOGPROBS], "out_logprobs", t_f32, "torch.float32", dev, rows, -1, &pl) != 0)
    return NULL;
  if (pt == NULL) {
    PyErr_SetString(PyExc_ValueError, "out (the int64 tokens [rows]) is required");
    return NULL;
  }
  void* stream;
  if (current_stream(dev, &stream) != 0) return NULL;
  adapter_reset(self);
  dpsComm_t comm = h->comm;
  const int64_t vlimit = limit > 0 ? (int64_t)limit : self->vocab;
  dpsResult_t st;
  PyThreadState* ts = op_gil_drop(self);
  st = dpsSample(comm, a.ptr, a.shape[0], a.shape[1], code, vlimit, &p, (int64_t*)pt,
                 (float*)pl, (struct CUstream_st*)stream);
  gil_take(ts);
  if (st != dpsSuccess) return op_fail(self, st);
  Py_RETURN_NONE;
}

static PyObject* comm_sample(CommObject* self, PyObject* args) {
  PyObject* o[9];
  long long limit;
  if (!PyArg_ParseTuple(args, "OLOOOOOOOO:_sample", &o[0], &limit, &o[1], &o[2], &o[3], &o[4],
                        &o[5], &o[6], &o[7], &o[8]))
    return NULL;
  Handle* h;
  if (comm_enter(self, "sample", &h) != 0) return NULL;
  PyObject* v = sample_body(self, h, o, limit);
  comm_leave(self, h);
  return v;
}

/* _verify_chain(local_logits, candidates, pad_bs, vocab_limit, temperature,
 *               top_k, top_p, min_p, seed, offset, vocab_mask, softcap,
 *               return_logprobs): dpsVerifyChain. The parameters are
 * sample's, with tensors of pad_bs entries (one per request); verify_chain()
 * has normalized them and checked softcap (0: off). Returns the views of the
 * persistent outputs: (predict, accept_index, accept_length), plus logprobs
 * when return_logprobs. */
static PyObject* verify_body(CommObject* self, Handle* h, PyObject* const* o, long long limit,
                             double softcap, int want_lp) {
  enum { X, CAND, PAD, TEMP, TOPK, TOPP, MINP, SEED, OFFSET, MASK };
  if (torch_load() != 0) return NULL;
  int pad_bs;
  if (pad_bs_arg(o[PAD], -1, &pad_bs) != 0) return NULL;
  if (pad_bs > self->max_pad_bs) {
    PyErr_Format(PyExc_ValueError, "pad_bs=%d must be in [1, max_pad_bs=%d]", pad_bs,
                 self->max_pad_bs);
    return NULL;
  }
  const int dev = self->device, n = self->n;
  const int64_t rows = (int64_t)pad_bs * n;
  dpsDataType_t code;
  TArg a, c;
  if (logits_arg(self, o[X], &code, &a) != 0) return NULL;
  if (a.shape[0] != rows) {
    PyErr_Format(PyExc_ValueError,
                 "local_logits has %lld rows but pad_bs*num_tokens_per_req = %d*%d = %lld",
                 (long long)a.shape[0], pad_bs, n, (long long)rows);
    return NULL;
  }
  if (expect_dtype(o[CAND], "candidates", t_i32, "torch.int32") != 0 ||
      tensor_arg(o[CAND], "candidates", dev, 2, 0, &c) != 0)
    return NULL;
  if (c.shape[0] != pad_bs || c.shape[1] != n) {
    PyErr_Format(PyExc_ValueError,
                 "candidates has shape [%lld, %lld] but must be [pad_bs, num_tokens_per_req] = "
                 "[%d, %d]",
                 (long long)c.shape[0], (long long)c.shape[1], pad_bs, n);
    return NULL;
  }
  const int32_t* mask = NULL;
  if (o[MASK] != Py_None) {
    TArg m;
    const int64_t words = (self->vocab + 31) / 32;
    if (expect_dtype(o[MASK], "vocab_mask", t_i32, "torch.int32") != 0 ||
        tensor_arg(o[MASK], "vocab_mask", dev, 2, 0, &m) != 0)
      return NULL;
    if (m.shape[0] != rows || m.shape[1] != words) {
      PyErr_Format(PyExc_ValueError,
                   "vocab_mask has shape [%lld, %lld] but must be [pad_bs*num_tokens_per_req, "
                   "ceil(vocab_size/32)] = [%lld, %lld]",
                   (long long)m.shape[0], (long long)m.shape[1], (long long)rows,
                   (long long)words);
      return NULL;
    }
    mask = (const int32_t*)m.ptr;
  }
  dpsSampleParams_t p = DPS_SAMPLE_PARAMS_INITIALIZER;
  if (sample_params(&o[TEMP], dev, pad_bs, PER_REQUEST, &p) != 0) return NULL;
  void* stream;
  if (current_stream(dev, &stream) != 0) return NULL;
  adapter_reset(self);
  dpsComm_t comm = h->comm;
  const int64_t vlimit = limit > 0 ? (int64_t)limit : self->vocab;
  int32_t *po = NULL, *aio = NULL, *alo = NULL;
  float* lpo = NULL;
  dpsResult_t st;
  PyThreadState* ts = op_gil_drop(self);
  st = dpsVerifyChain(comm, a.ptr, a.shape[0], a.shape[1], code, vlimit, pad_bs,
                      (const int32_t*)c.ptr, &p, mask, (float)softcap, &po, &aio, &alo,
                      want_lp ? &lpo : NULL, (struct CUstream_st*)stream);
  gil_take(ts);
  if (st != dpsSuccess) return op_fail(self, st);
  PyObject* t = outputs_view(self, h, V_VERIFY, po, aio, alo, pad_bs);
  if (t == NULL || !want_lp) return t;
  PyObject* l = logprobs_view(self, h, V_VERIFY_LP, lpo, pad_bs);
  PyObject* v = l == NULL ? NULL
                          : PyTuple_Pack(4, PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1),
                                         PyTuple_GET_ITEM(t, 2), l);
  Py_DECREF(t);
  Py_XDECREF(l);
  return v;
}

static PyObject* comm_verify_chain(CommObject* self, PyObject* args) {
  PyObject* o[10];
  long long limit;
  double softcap;
  int want_lp;
  if (!PyArg_ParseTuple(args, "OOOLOOOOOOOdp:_verify_chain", &o[0], &o[1], &o[2], &limit, &o[3],
                        &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &softcap, &want_lp))
    return NULL;
  Handle* h;
  if (comm_enter(self, "verify_chain", &h) != 0) return NULL;
  PyObject* v = verify_body(self, h, o, limit, softcap, want_lp);
  comm_leave(self, h);
  return v;
}

/* sample_stats(): dpsCommGetSampleStats as a dict. It waits for the sampling
 * work already enqueued (a host sync), so it runs without the GIL. When
 * invalid_calls grew since this object's previous read, the library's last
 * error names the first invalid row, argument and value: last_invalid. */
static PyObject* comm_sample_stats(CommObject* self, PyObject* unused) {
  (void)unused;
  Handle* h;
  if (comm_enter(self, "sample_stats", &h) != 0) return NULL;
  PyObject* ret = NULL;
  dpsSampleStats_t st;
  memset(&st, 0, sizeof st);
  dpsComm_t comm = h->comm;
  dpsResult_t r;
  Py_BEGIN_ALLOW_THREADS;
  r = dpsCommGetSampleStats(comm, &st);
  Py_END_ALLOW_THREADS;
  if (r != dpsSuccess) {
    raise_dps(r); /* no adapter involved: the library's own message */
    comm_leave(self, h);
    return NULL;
  }
  /* read the message now, on this thread, before any other library call */
  const char* msg = st.invalid_calls > self->invalid_seen ? dpsGetLastError() : NULL;
  PyObject* last = msg != NULL ? PyUnicode_FromString(msg) : (Py_INCREF(Py_None), Py_None);
  if (last != NULL) {
    ret = Py_BuildValue("{s:K,s:K,s:K,s:K,s:O}", "rows_greedy",
                        (unsigned long long)st.rows_greedy, "rows_fast",
                        (unsigned long long)st.rows_fast, "rows_exact",
                        (unsigned long long)st.rows_exact, "invalid_calls",
                        (unsigned long long)st.invalid_calls, "last_invalid", last);
    Py_DECREF(last);
  }
  if (ret != NULL) self->invalid_seen = st.invalid_calls;
  comm_leave(self, h);
  return ret;
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
    {"_select", (PyCFunction)comm_select, METH_VARARGS,
     "_select(local_logits, k, vocab_limit, value, index, lse): argmax (k<0) or top-k into the "
     "given tensors (None: not wanted; vocab_limit <= 0: the vocab size)"},
    {"_sample", (PyCFunction)comm_sample, METH_VARARGS,
     "_sample(local_logits, vocab_limit, temperature, top_k, top_p, min_p, seed, offset, "
     "tokens, logprobs): dpsSample into the given tensors (a parameter is a Python number for "
     "every row or a tensor [rows]; logprobs None: not wanted; vocab_limit <= 0: the vocab size)"},
    {"_verify_chain", (PyCFunction)comm_verify_chain, METH_VARARGS,
     "_verify_chain(local_logits, candidates, pad_bs, vocab_limit, temperature, top_k, top_p, "
     "min_p, seed, offset, vocab_mask, softcap, return_logprobs): dpsVerifyChain (parameters as "
     "_sample's, tensors of pad_bs entries; vocab_mask None: none; softcap 0: off) -> (predict, "
     "accept_index, accept_length[, logprobs]), views of persistent outputs"},
    {"sample_stats", (PyCFunction)comm_sample_stats, METH_NOARGS,
     "sample_stats($self, /)\n--\n\n"
     "Rows sampled on this communicator by path, and invalid calls: a dict with rows_greedy, "
     "rows_fast, rows_exact, invalid_calls and last_invalid (the library's message naming the "
     "first invalid row, argument and value when invalid_calls grew since the previous read, "
     "else None). Waits for the sampling work already enqueued: not for the hot path."},
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

PyTypeObject CommType = {
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
