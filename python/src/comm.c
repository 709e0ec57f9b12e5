/* Comm, the base type of dpsampling.DpSamplingComm (one dpsComm_t): its
 * lifecycle (creation, collectives, prepare, close, the finalizer and the
 * capture-safe release), the protocol of a call in progress, the queries, and
 * the refcounted Handle that its tensors share. The operations are in ops.c
 * and sample.c. */
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
  OutSlot outs[O_COUNT];
  memcpy(outs, self->outs, sizeof outs);
  memset(self->outs, 0, sizeof self->outs);
  Adapter* a = self->adapter;
  Handle* h = self->h;
  self->adapter = NULL;
  self->h = NULL;
  if (a != NULL && h != NULL) (void)dpsCommSetCollectives(h->comm, NULL);
  free_views(views);
  out_slots_free(outs);
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
 * (dpsCommOpMayBlock: NCCL's enqueue may set up connections with the
 * peers), and a swap that fixes the dtype does (swap_body). A call that only
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

PyObject* comm_run(CommObject* self, const char* op, OpBody body, PyObject* const* a) {
  Handle* h;
  if (comm_enter(self, op, &h) != 0) return NULL;
  PyObject* v = body(self, h, a);
  comm_leave(self, h);
  return v;
}

int op_launch(CommObject* self, Handle* h, OpCall call, void* ctx) {
  void* stream;
  if (current_stream(self->device, &stream) != 0) return -1;
  adapter_reset(self);
  dpsComm_t comm = h->comm;
  PyThreadState* ts = op_gil_drop(self);
  const dpsResult_t r = call(comm, ctx, (struct CUstream_st*)stream);
  gil_take(ts);
  if (r == dpsSuccess) return 0;
  op_fail(self, r);
  return -1;
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
    nomem = view_cache_init(&views[i], (int64_t)max_pad_bs + 1) != 0;
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
static PyObject* set_collectives_body(CommObject* self, Handle* h, PyObject* const* args) {
  PyObject* backend = args[0];
  PyObject* group = args[1];
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
  PyObject* a[2] = {backend, group};
  return comm_run(self, "_set_collectives", set_collectives_body, a);
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

static PyObject* comm_prepare(CommObject* self, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kw) {
  /* the upstream component's name, then ours before 0.5 (keyword only) */
  static const char* const names[] = {"logits_dtype", "dtype", NULL};
  static const char* const fname = "prepare_verify_outputs";
  PyObject* a[2];
  if (fast_args_pos(fname, names, 0, 1, args, nargs, kw, a) != 0) return NULL;
  if (fast_alias(fname, names, a, 0, 1) != 0) return NULL;
  PyObject* d = a[0];
  Handle* h;
  if (comm_enter(self, "prepare_verify_outputs", &h) != 0) return NULL;
  PyObject* ret = NULL;
  int code = dtype_code_of(d, 0, "logits_dtype"); /* may import torch */
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
    /* the upstream component's meaning: its one-sided state exists (never on
     * nccl), which its engine reads as "may not be re-created for a new vocab" */
    case P_INIT: return PyBool_FromLong(info.initialized && info.backend == dpsBackendOnesided);
    case P_DEVICE: return PyLong_FromLong(info.cuda_device);
    case P_TIMEOUT: return PyLong_FromLong(info.timeout_ms);
    case P_DTYPE:
      if (info.logits_dtype == dpsDtypeUnset) Py_RETURN_NONE;
      if (torch_load() != 0) return NULL;
      {
        const int dt = dt_of_code(info.logits_dtype);
        if (dt < 0) Py_RETURN_NONE;
        Py_INCREF(t_dtypes[dt]);
        return t_dtypes[dt];
      }
    default: Py_RETURN_NONE;
  }
}

static PyMethodDef comm_methods[] = {
    {"_select", (PyCFunction)(void (*)(void))comm_select, METH_FASTCALL,
     "_select(local_logits, k, vocab_limit, value, index, lse, want_lse): argmax (k<0) or "
     "top-k into the given tensors (None: the persistent outputs; vocab_limit <= 0: the vocab "
     "size) -> (values, indices[, lse])"},
    {"_sample", (PyCFunction)(void (*)(void))comm_sample, METH_FASTCALL,
     "_sample(local_logits, vocab_limit, temperature, top_k, top_p, min_p, seed, offset, "
     "out, out_logprobs[, want_logprobs]): dpsSample into the given tensors (None: the "
     "persistent outputs; a parameter is a Python number for every row or a tensor [rows]; "
     "want_logprobs defaults to out_logprobs is not None; vocab_limit <= 0: the vocab size) "
     "-> tokens | (tokens, logprobs)"},
    {"_verify_chain", (PyCFunction)(void (*)(void))comm_verify_chain, METH_FASTCALL,
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
    KW_METHOD("argmax", comm_argmax, doc_argmax),
    KW_METHOD("topk", comm_topk, doc_topk),
    KW_METHOD("sample", comm_sample_m, doc_sample),
    KW_METHOD("verify_chain", comm_verify_chain_m, doc_verify_chain),
    KW_METHOD("swap_batch_vocab", comm_swap,
              "swap_batch_vocab($self, /, local_logits, pad_bs=None)\n--\n\n"
              "[pad_bs*N, V/tp] logits -> this rank's [pad_bs/tp*N, V] rows (a view of the "
              "persistent output, valid until the next swap). pad_bs=None: "
              "local_logits.shape[0] // N."),
    KW_METHOD("_swap_batch_vocab_new", comm_swap_new,
              "_swap_batch_vocab_new($self, /, local_logits, pad_bs=None)\n--\n\n"
              "swap_batch_vocab returning a new tensor (a copy)"),
    KW_METHOD("gather_verify_outputs", comm_gather_outputs,
              "gather_verify_outputs($self, /, predict_local, accept_index_local, "
              "accept_length_local, pad_bs=None)\n--\n\n"
              "int32 [pad_bs/tp, N], [pad_bs/tp, N], [pad_bs/tp] -> (predict [pad_bs, N], "
              "accept_index [pad_bs, N], accept_length [pad_bs]), views of persistent outputs. "
              "The keywords predict, accept_index, accept_length are taken too."),
    KW_METHOD("gather_verify_logprobs", comm_gather_logprobs,
              "gather_verify_logprobs($self, /, logprobs_local, pad_bs=None)\n--\n\n"
              "float32 [pad_bs/tp, N] -> [pad_bs, N] (a view of the persistent output). The "
              "keyword logprobs is taken too."),
    KW_METHOD("prepare_verify_outputs", comm_prepare,
              "prepare_verify_outputs($self, /, logits_dtype)\n--\n\n"
              "Fix the logits dtype if unset and allocate its buffers (collective). The keyword "
              "dtype is taken too."),
    {"close", (PyCFunction)comm_close, METH_NOARGS,
     "close($self, /)\n--\n\nThe collective teardown: call it on every rank together, outside "
     "CUDA graph capture. Later calls raise; tensors returned earlier stay valid until they go."},
    {"async_error", (PyCFunction)comm_async_error, METH_NOARGS,
     "async_error($self, /)\n--\n\n"
     "None, or a description of the asynchronous error (e.g. a one-sided timeout)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef comm_getset[] = {
    {"backend", (getter)comm_get, NULL, "resolved backend: 'nccl' or 'onesided'", (void*)P_BACKEND},
    {"requested_backend", (getter)comm_get, NULL, "backend as requested", (void*)P_REQUESTED},
    {"fast_path_enabled", (getter)comm_get, NULL, "backend == 'onesided'", (void*)P_FAST},
    {"max_pad_bs", (getter)comm_get, NULL, NULL, (void*)P_MAX_PAD_BS},
    {"tp_size", (getter)comm_get, NULL, NULL, (void*)P_TP},
    {"rank", (getter)comm_get, NULL, NULL, (void*)P_RANK},
    {"num_tokens_per_req", (getter)comm_get, NULL, NULL, (void*)P_N},
    {"vocab_size", (getter)comm_get, NULL, NULL, (void*)P_VOCAB},
    {"is_initialized", (getter)comm_get, NULL,
     "backend == 'onesided' and its buffers exist (the dtype is fixed); always False on nccl",
     (void*)P_INIT},
    {"cuda_device", (getter)comm_get, NULL, NULL, (void*)P_DEVICE},
    {"logits_dtype", (getter)comm_get, NULL, "torch dtype of the logits, or None while unset",
     (void*)P_DTYPE},
    {"timeout_ms", (getter)comm_get, NULL, "effective one-sided timeout", (void*)P_TIMEOUT},
    {"closed", (getter)comm_get, NULL, NULL, (void*)P_CLOSED},
    {NULL, NULL, NULL, NULL, NULL}};

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
