/* The operations of Comm that move or select data: swap_batch_vocab, the two
 * verify gathers, argmax and topk; the views of the library's persistent
 * buffers, and the binding's own persistent outputs of the operations that
 * write the caller's buffers (argmax, topk, sample). Every call goes through
 * comm_run (the call protocol, comm.c) and op_launch (the library call). */
#include "binding.h"

/* ------------------------------------------------------------------------- */
/* Arguments                                                                  */

int logits_arg(CommObject* self, PyObject* x, int* dt, TArg* a) {
  const int r = tensor_arg(x, "local_logits", self->device, DT_LOGITS, 2, 0, a);
  if (r == TARG_DTYPE) return logits_dtype_error(x, "local_logits");
  *dt = a->dt;
  return r;
}

/* ------------------------------------------------------------------------- */
/* Views of the library's persistent buffers                                  */

/* The cached view [d0] (d1 == 0) or [d0, d1] of `ptr` in ViewCache `c`,
 * entry i, keyed by ptr alone. */
static PyObject* buffer_view(ViewCache* c, Handle* h, int device, void* ptr, int64_t i, Dt dt,
                             int64_t d0, int64_t d1) {
  void* key[VIEW_CACHE_KEYS] = {ptr};
  PyObject* v = view_cache_get(c, key, i);
  if (v != NULL) return v;
  const int64_t shape[2] = {d0, d1};
  v = make_tensor(h, ptr, device, g_dtypes[dt].dl, d1 > 0 ? 2 : 1, shape);
  if (v == NULL) return NULL;
  return view_cache_put(c, i, v);
}

PyObject* outputs_view(CommObject* self, Handle* h, int which, int32_t* po, int32_t* aio,
                       int32_t* alo, int pad_bs) {
  void* key[VIEW_CACHE_KEYS] = {po, aio, alo};
  PyObject* v = view_cache_get(&self->views[which], key, pad_bs);
  if (v != NULL) return v;
  PyObject* t[3] = {NULL, NULL, NULL};
  int32_t* ptrs[3] = {po, aio, alo};
  for (int i = 0; i < 3; ++i) {
    const int64_t shape[2] = {pad_bs, self->n};
    t[i] = make_tensor(h, ptrs[i], self->device, g_dtypes[DT_I32].dl, i < 2 ? 2 : 1, shape);
    if (t[i] == NULL) break;
  }
  v = t[2] != NULL ? PyTuple_Pack(3, t[0], t[1], t[2]) : NULL;
  for (int i = 0; i < 3; ++i) Py_XDECREF(t[i]);
  if (v == NULL) return NULL;
  return view_cache_put(&self->views[which], pad_bs, v);
}

PyObject* logprobs_view(CommObject* self, Handle* h, int which, float* out, int pad_bs) {
  return buffer_view(&self->views[which], h, self->device, out, pad_bs, DT_F32, pad_bs, self->n);
}

/* ------------------------------------------------------------------------- */
/* The binding's persistent outputs (argmax, topk, sample)                    */

void out_slots_free(OutSlot* slots) {
  for (int i = 0; i < O_COUNT; ++i) {
    view_cache_free(&slots[i].views);
    Py_CLEAR(slots[i].base);
    slots[i].bytes = 0;
  }
}

/* The bytes of a slot's base: every output the slot can hold, so that it is
 * allocated once and never moves (a CUDA graph captured with it keeps
 * writing there): max_pad_bs*N rows, DPS_TOPK_MAX columns for topk, the
 * largest element size of the slot (4 for values of any logits dtype). */
static int64_t slot_bytes(const CommObject* self, int slot) {
  const int64_t rows = (int64_t)self->max_pad_bs * self->n;
  const int64_t cols = (slot == O_TOPK_VALUES || slot == O_TOPK_INDICES) ? DPS_TOPK_MAX : 1;
  const int wide = slot == O_ARGMAX_INDEX || slot == O_TOPK_INDICES || slot == O_SAMPLE_TOKENS;
  return rows * cols * (wide ? 8 : 4);
}

/* The slot's base: torch.empty(slot_bytes, dtype=uint8) on the device, made
 * by the first call that needs it. */
static int slot_reserve(CommObject* self, int slot) {
  OutSlot* s = &self->outs[slot];
  if (s->base != NULL) return 0;
  if (s->views.v == NULL && view_cache_init(&s->views, (int64_t)self->max_pad_bs * self->n + 1) != 0) {
    PyErr_NoMemory();
    return -1;
  }
  const int64_t bytes = slot_bytes(self, slot);
  PyObject* size = Py_BuildValue("(L)", (long long)bytes);
  PyObject* kw = size != NULL ? Py_BuildValue("{s:O,s:i}", "dtype", t_dtypes[DT_U8], "device",
                                              self->device)
                              : NULL;
  PyObject* base = kw != NULL ? PyObject_Call(t_empty, size, kw) : NULL;
  Py_XDECREF(kw);
  Py_XDECREF(size);
  if (base == NULL) return -1;
  TArg a;
  if (tensor_arg(base, "the persistent output", self->device, 0, -1, 0, &a) != 0) {
    Py_DECREF(base);
    return -1;
  }
  s->base = base;
  s->bytes = bytes;
  s->ptr = a.ptr;
  return 0;
}

/* base[:rows*k*size].view(dtype), then .view(rows, k) when k > 0. */
static PyObject* slot_make_view(OutSlot* s, Dt dt, int64_t rows, int k) {
  const int64_t elems = rows * (k > 0 ? k : 1);
  PyObject* bytes = PySequence_GetSlice(s->base, 0, (Py_ssize_t)(elems * g_dtypes[dt].size));
  if (bytes == NULL) return NULL;
  PyObject* typed = PyObject_CallMethodOneArg(bytes, s_view, t_dtypes[dt]);
  Py_DECREF(bytes);
  if (typed == NULL || k <= 0) return typed;
  PyObject* v = PyObject_CallMethod(typed, "view", "(LL)", (long long)rows, (long long)k);
  Py_DECREF(typed);
  return v;
}

/* The slot's view [rows] (k == 0) or [rows, k] of dtype dt (a new reference);
 * 1 <= rows <= max_pad_bs*N, k <= DPS_TOPK_MAX (the caller checks both). */
static PyObject* slot_view(CommObject* self, int slot, Dt dt, int64_t rows, int k) {
  OutSlot* s = &self->outs[slot];
  if (slot_reserve(self, slot) != 0) return NULL;
  void* key[VIEW_CACHE_KEYS] = {s->base, (void*)(intptr_t)(dt + 1), (void*)(intptr_t)k};
  PyObject* v = view_cache_get(&s->views, key, rows);
  if (v != NULL) return v;
  v = slot_make_view(s, dt, rows, k);
  if (v == NULL) return NULL;
  return view_cache_put(&s->views, rows, v);
}

int out_tensor(CommObject* self, PyObject* t, const char* name, int slot, Dt want, int64_t rows,
               int k, PyObject** res, void** ptr) {
  *res = NULL;
  *ptr = NULL;
  if (t == NULL || t == Py_None) {
    if (rows < 1 || rows > (int64_t)self->max_pad_bs * self->n || k > DPS_TOPK_MAX) {
      *res = Py_None; /* the library refuses the rows or k, naming them */
      Py_INCREF(Py_None);
      return 0;
    }
    if ((*res = slot_view(self, slot, want, rows, k)) == NULL) return -1;
    *ptr = self->outs[slot].ptr; /* every view starts at the base */
    return 0;
  }
  TArg a;
  if (typed_arg(t, name, self->device, want, -1, 1, &a) != 0) return -1;
  const int64_t elems = rows * (k > 0 ? k : 1);
  if (a.nbytes != elems * g_dtypes[want].size) {
    PyErr_Format(PyExc_ValueError, "%s must hold %lld elements ([%lld%s]), got %lld bytes", name,
                 (long long)elems, (long long)rows, k > 0 ? ", k" : "", (long long)a.nbytes);
    return -1;
  }
  Py_INCREF(t);
  *res = t;
  *ptr = a.ptr;
  return 0;
}

/* ------------------------------------------------------------------------- */
/* swap_batch_vocab                                                           */

typedef struct {
  TArg a;
  int dt, pad_bs;
  void* out;
} SwapCall;

static dpsResult_t swap_call(dpsComm_t comm, void* ctx, struct CUstream_st* stream) {
  SwapCall* c = (SwapCall*)ctx;
  return dpsSwapBatchVocab(comm, c->a.ptr, c->a.shape[0], c->a.shape[1], g_dtypes[c->dt].code,
                           c->pad_bs, &c->out, stream);
}

static PyObject* swap_body(CommObject* self, Handle* h, PyObject* const* a) {
  if (torch_load() != 0) return NULL;
  SwapCall c = {0};
  if (logits_arg(self, a[0], &c.dt, &c.a) != 0) return NULL;
  long dflt = (c.a.shape[0] % self->n == 0) ? (long)(c.a.shape[0] / self->n) : -1;
  if (pad_bs_arg(a[1] != NULL ? a[1] : Py_None, dflt, &c.pad_bs) != 0) return NULL;
  /* a swap with the dtype unset fixes it: collective and allocating, so it
   * may block whatever the backend (dpsCommOpMayBlock leaves it to us) */
  if (!self->info.initialized) self->may_block = 1;
  if (op_launch(self, h, swap_call, &c) != 0) return NULL;
  return buffer_view(&self->views[V_SWAP], h, self->device, c.out, c.pad_bs, c.dt,
                     (int64_t)(c.pad_bs / self->tp) * self->n, self->vocab);
}

static PyObject* swap_new_body(CommObject* self, Handle* h, PyObject* const* a) {
  PyObject* v = swap_body(self, h, a);
  if (v == NULL) return NULL;
  PyObject* c = PyObject_CallMethodNoArgs(v, s_clone); /* on torch's current stream */
  Py_DECREF(v);
  return c;
}

static const char* const swap_names[] = {"local_logits", "pad_bs", NULL};

PyObject* comm_swap(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  PyObject* a[2];
  if (fast_args("swap_batch_vocab", swap_names, 1, args, nargs, kw, a) != 0) return NULL;
  return comm_run(self, "swap_batch_vocab", swap_body, a);
}

PyObject* comm_swap_new(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  PyObject* a[2];
  if (fast_args("_swap_batch_vocab_new", swap_names, 1, args, nargs, kw, a) != 0) return NULL;
  return comm_run(self, "swap_batch_vocab", swap_new_body, a);
}

/* ------------------------------------------------------------------------- */
/* gather_verify_outputs, gather_verify_logprobs                              */

typedef struct {
  TArg p, ai, al;
  int pad_bs;
  int32_t *po, *aio, *alo;
} GatherCall;

static dpsResult_t gather_call(dpsComm_t comm, void* ctx, struct CUstream_st* stream) {
  GatherCall* c = (GatherCall*)ctx;
  return dpsGatherVerifyOutputs(comm, (const int32_t*)c->p.ptr, (const int32_t*)c->ai.ptr,
                                (const int32_t*)c->al.ptr, c->p.shape[0], c->p.shape[1],
                                c->pad_bs, &c->po, &c->aio, &c->alo, stream);
}

static PyObject* gather_outputs_body(CommObject* self, Handle* h, PyObject* const* a) {
  if (torch_load() != 0) return NULL;
  static const char* const names[3] = {"predict", "accept_index", "accept_length"};
  GatherCall c = {0};
  TArg* t[3] = {&c.p, &c.ai, &c.al};
  for (int i = 0; i < 3; ++i)
    if (typed_arg(a[i], names[i], self->device, DT_I32, i < 2 ? 2 : 1, 0, t[i]) != 0) return NULL;
  if (c.ai.shape[0] != c.p.shape[0] || c.ai.shape[1] != c.p.shape[1]) {
    PyErr_Format(PyExc_ValueError, "accept_index is [%lld, %lld] but predict is [%lld, %lld]",
                 (long long)c.ai.shape[0], (long long)c.ai.shape[1], (long long)c.p.shape[0],
                 (long long)c.p.shape[1]);
    return NULL;
  }
  if (c.al.shape[0] != c.p.shape[0]) {
    PyErr_Format(PyExc_ValueError, "accept_length is [%lld] but predict has %lld rows",
                 (long long)c.al.shape[0], (long long)c.p.shape[0]);
    return NULL;
  }
  if (pad_bs_arg(a[3] != NULL ? a[3] : Py_None, inferred_pad_bs(c.p.shape[0], self->tp),
                 &c.pad_bs) != 0)
    return NULL;
  if (op_launch(self, h, gather_call, &c) != 0) return NULL;
  return outputs_view(self, h, V_GATHER, c.po, c.aio, c.alo, c.pad_bs);
}

PyObject* comm_gather_outputs(CommObject* self, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kw) {
  /* the upstream component's names, then ours before 0.5 (keyword only) */
  static const char* const names[] = {"predict_local", "accept_index_local",
                                      "accept_length_local", "pad_bs", "predict", "accept_index",
                                      "accept_length", NULL};
  static const char* const fname = "gather_verify_outputs";
  PyObject* a[7];
  if (fast_args_pos(fname, names, 0, 4, args, nargs, kw, a) != 0) return NULL;
  for (int i = 0; i < 3; ++i)
    if (fast_alias(fname, names, a, i, 4 + i) != 0) return NULL;
  return comm_run(self, fname, gather_outputs_body, a);
}

typedef struct {
  TArg x;
  int pad_bs;
  float* out;
} LogprobsCall;

static dpsResult_t logprobs_call(dpsComm_t comm, void* ctx, struct CUstream_st* stream) {
  LogprobsCall* c = (LogprobsCall*)ctx;
  return dpsGatherVerifyLogprobs(comm, (const float*)c->x.ptr, c->x.shape[0], c->x.shape[1],
                                 c->pad_bs, &c->out, stream);
}

static PyObject* gather_logprobs_body(CommObject* self, Handle* h, PyObject* const* a) {
  if (torch_load() != 0) return NULL;
  LogprobsCall c = {0};
  if (typed_arg(a[0], "logprobs", self->device, DT_F32, 2, 0, &c.x) != 0) return NULL;
  if (pad_bs_arg(a[1] != NULL ? a[1] : Py_None, inferred_pad_bs(c.x.shape[0], self->tp),
                 &c.pad_bs) != 0)
    return NULL;
  if (op_launch(self, h, logprobs_call, &c) != 0) return NULL;
  return logprobs_view(self, h, V_LOGPROB, c.out, c.pad_bs);
}

PyObject* comm_gather_logprobs(CommObject* self, PyObject* const* args, Py_ssize_t nargs,
                               PyObject* kw) {
  static const char* const names[] = {"logprobs_local", "pad_bs", "logprobs", NULL};
  static const char* const fname = "gather_verify_logprobs";
  PyObject* a[3];
  if (fast_args_pos(fname, names, 0, 2, args, nargs, kw, a) != 0) return NULL;
  if (fast_alias(fname, names, a, 0, 2) != 0) return NULL;
  return comm_run(self, fname, gather_logprobs_body, a);
}

/* ------------------------------------------------------------------------- */
/* argmax, topk                                                               */

/* _select(logits, k, vocab_limit, out_value, out_index, out_lse, want_lse):
 * dpsArgmax (k < 0) or dpsTopK (k >= 0: the library checks k); vocab_limit
 * <= 0: the vocab size. Each out_* is the caller's tensor or None (the
 * persistent output). Returns (values, indices), plus lse when want_lse
 * (argmax only), values first as in the C API. */
typedef struct {
  TArg a;
  int dt, k;
  int64_t vlimit;
  void *pv, *pi, *pl;
} SelectCall;

static dpsResult_t select_call(dpsComm_t comm, void* ctx, struct CUstream_st* stream) {
  SelectCall* c = (SelectCall*)ctx;
  const dpsDataType_t code = g_dtypes[c->dt].code;
  if (c->k < 0)
    return dpsArgmax(comm, c->a.ptr, c->a.shape[0], c->a.shape[1], code, c->vlimit, c->pv,
                     (int64_t*)c->pi, (float*)c->pl, stream);
  return dpsTopK(comm, c->a.ptr, c->a.shape[0], c->a.shape[1], code, c->k, c->vlimit, c->pv,
                 (int64_t*)c->pi, stream);
}

enum { SEL_X, SEL_K, SEL_LIMIT, SEL_VALUE, SEL_INDEX, SEL_LSE, SEL_WANT_LSE, SEL_NARGS };

static PyObject* select_body(CommObject* self, Handle* h, PyObject* const* a) {
  if (torch_load() != 0) return NULL;
  SelectCall c = {0};
  c.k = (int)PyLong_AsLong(a[SEL_K]);
  const long long limit = PyLong_AsLongLong(a[SEL_LIMIT]);
  const int want_lse = PyObject_IsTrue(a[SEL_WANT_LSE]);
  if (PyErr_Occurred()) return NULL;
  c.vlimit = limit > 0 ? (int64_t)limit : self->vocab;
  if (logits_arg(self, a[SEL_X], &c.dt, &c.a) != 0) return NULL;
  const int topk = c.k >= 0;
  const int kk = topk ? c.k : 0;
  const int64_t rows = c.a.shape[0];
  PyObject* o[3] = {NULL, NULL, NULL};
  PyObject* ret = NULL;
  if (out_tensor(self, a[SEL_VALUE],
                 topk ? "out_values" : "out_value", topk ? O_TOPK_VALUES : O_ARGMAX_VALUE,
                 (Dt)c.dt, rows, kk, &o[0], &c.pv) != 0 ||
      out_tensor(self, a[SEL_INDEX],
                 topk ? "out_indices" : "out_index", topk ? O_TOPK_INDICES : O_ARGMAX_INDEX,
                 DT_I64, rows, kk, &o[1], &c.pi) != 0 ||
      (want_lse && !topk &&
       out_tensor(self, a[SEL_LSE], "out_lse", O_ARGMAX_LSE,
                  DT_F32, rows, 0, &o[2], &c.pl) != 0))
    goto done;
  if (op_launch(self, h, select_call, &c) != 0) goto done;
  ret = o[2] != NULL ? PyTuple_Pack(3, o[0], o[1], o[2]) : PyTuple_Pack(2, o[0], o[1]);
done:
  for (int i = 0; i < 3; ++i) Py_XDECREF(o[i]);
  return ret;
}

PyObject* comm_select(CommObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != SEL_NARGS) {
    PyErr_Format(PyExc_TypeError, "_select() takes %d arguments (%zd given)", SEL_NARGS, nargs);
    return NULL;
  }
  const long k = PyLong_AsLong(args[SEL_K]);
  if (k == -1 && PyErr_Occurred()) return NULL;
  if (k < INT32_MIN || k > INT32_MAX) {
    PyErr_Format(PyExc_ValueError, "k=%ld is out of range", k);
    return NULL;
  }
  return comm_run(self, k >= 0 ? "topk" : "argmax", select_body, args);
}

/* ------------------------------------------------------------------------- */
/* argmax, topk: the public methods                                           */

/* vocab_limit as _select takes it (a new reference): None -> 0; an int >= 1
 * as it is (the library checks it against V); anything else through the
 * package's _limit_arg (int-like objects; the errors). */
PyObject* limit_value(PyObject* o) {
  if (o == NULL || o == Py_None) return PyLong_FromLong(0);
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (!overflow && v >= 1) {
      Py_INCREF(o);
      return o;
    }
  }
  PyObject* f = arg_helper("limit");
  return f != NULL ? PyObject_CallOneArg(f, o) : NULL;
}

static PyObject* select_run(CommObject* self, const char* op, PyObject* x, long k, PyObject* limit,
                            PyObject* value, PyObject* index, PyObject* lse, PyObject* want_lse) {
  PyObject* kk = PyLong_FromLong(k);
  if (kk == NULL) return NULL;
  PyObject* a[SEL_NARGS];
  a[SEL_X] = x;
  a[SEL_K] = kk;
  a[SEL_LIMIT] = limit;
  a[SEL_VALUE] = value != NULL ? value : Py_None;
  a[SEL_INDEX] = index != NULL ? index : Py_None;
  a[SEL_LSE] = lse != NULL ? lse : Py_None;
  a[SEL_WANT_LSE] = want_lse != NULL ? want_lse : Py_False;
  PyObject* r = comm_run(self, op, select_body, a);
  Py_DECREF(kk);
  return r;
}

const char doc_argmax[] =
    "argmax($self, /, local_logits, vocab_limit=None, return_logsumexp=False, *, "
    "out_value=None, out_index=None, out_lse=None)\n--\n\n"
    "Argmax of every row over the whole vocabulary, from this rank's\n"
    "[rows, V/tp] shard (every rank passes the same rows): (values [rows]\n"
    "in the logits dtype, indices int64 [rows]), the order of torch.max,\n"
    "plus the row's logsumexp (fp32) with return_logsumexp=True, so the\n"
    "token's logprob is value - lse. Ties go to the lower global index,\n"
    "NaN never wins, columns at or beyond vocab_limit (global) are\n"
    "excluded. The out_* tensors, when given, are written in place and\n"
    "returned; the others are views of the communicator's persistent\n"
    "outputs, valid until the next argmax() (no allocation per call). At\n"
    "most 8 ranks (tp_size <= 8): more raise RuntimeError.";

PyObject* comm_argmax(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  static const char* const names[] = {"local_logits", "vocab_limit", "return_logsumexp",
                                      "out_value",    "out_index",   "out_lse",
                                      NULL};
  PyObject* a[6];
  if (fast_args_pos("argmax", names, 1, 3, args, nargs, kw, a) != 0) return NULL;
  PyObject* limit = limit_value(a[1]);
  if (limit == NULL) return NULL;
  PyObject* r = select_run(self, "argmax", a[0], -1, limit, a[3], a[4], a[5], a[2]);
  Py_DECREF(limit);
  return r;
}

const char doc_topk[] =
    "topk($self, /, local_logits, k, vocab_limit=None, *, out_values=None, "
    "out_indices=None)\n--\n\n"
    "The k best of every row over the whole vocabulary, best first, from\n"
    "this rank's [rows, V/tp] shard: (values [rows, k] in the logits dtype,\n"
    "indices int64 [rows, k]), the order of torch.topk and of argmax; the\n"
    "same ranking rules as argmax. 1 <= k <= min(64, vocab_limit).\n"
    "out_values / out_indices, when given, are written in place and\n"
    "returned; the others are views of the communicator's persistent\n"
    "outputs, valid until the next topk().";

PyObject* comm_topk(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  static const char* const names[] = {"local_logits", "k", "vocab_limit", "out_values",
                                      "out_indices", NULL};
  PyObject* a[5];
  if (fast_args_pos("topk", names, 2, 3, args, nargs, kw, a) != 0) return NULL;
  /* k: an int up to INT32_MAX as it is, else the package's _int_arg (int-like
   * objects; TypeError / ValueError naming k); then k >= 1 (the binding's
   * _select takes k < 0 for argmax) */
  PyObject* k = a[1];
  Py_INCREF(k);
  int overflow = 0;
  long long kv = 0;
  if (PyLong_CheckExact(k)) {
    kv = PyLong_AsLongLongAndOverflow(k, &overflow);
    if (kv == -1 && PyErr_Occurred()) goto fail;
  }
  if (!PyLong_CheckExact(k) || overflow > 0 || kv > INT32_MAX) {
    PyObject* f = arg_helper("int_arg");
    PyObject* v = f != NULL ? PyObject_CallFunction(f, "sO", "k", k) : NULL;
    if (v == NULL) goto fail;
    Py_SETREF(k, v);
    kv = PyLong_AsLongLongAndOverflow(k, &overflow);
    if (kv == -1 && PyErr_Occurred()) goto fail;
  }
  if (overflow < 0 || kv < 1) {
    PyErr_Format(PyExc_ValueError, "k=%R must be >= 1 (argmax() for the best one)", k);
    goto fail;
  }
  Py_DECREF(k);
  PyObject* limit = limit_value(a[2]);
  if (limit == NULL) return NULL;
  PyObject* r = select_run(self, "topk", a[0], (long)kv, limit, a[3], a[4], NULL, NULL);
  Py_DECREF(limit);
  return r;
fail:
  Py_DECREF(k);
  return NULL;
}
