/* The sampling operations of Comm: sample and verify_chain, and their
 * parameters (a Python number for every row, or a tensor of one entry per
 * row or request). */
#include "binding.h"

#include <float.h>

/* The length of a parameter tensor: one entry per row (sample: `n` rows of
 * local_logits) or per request (verify_chain: n == pad_bs). */
typedef enum { PER_ROW, PER_REQUEST } ParamsPer;

/* One tensor parameter: dtype (want, or the row alt when alt >= 0), 1-D, `n`
 * long, contiguous, on the communicator's device. *is_alt says which dtype. */
static int sample_array(PyObject* t, const char* name, Dt want, int alt, const char* want_names,
                        int device, int64_t n, ParamsPer per, const void** ptr, int* is_alt) {
  const char* dim = per == PER_ROW ? "rows" : "pad_bs";
  TArg a;
  const int r =
      tensor_arg(t, name, device, DT_BIT(want) | (alt >= 0 ? DT_BIT(alt) : 0u), 1, 0, &a);
  if (r == TARG_DTYPE) {
    PyObject* got = PyObject_GetAttr(t, s_dtype);
    if (got != NULL)
      PyErr_Format(PyExc_TypeError, "%s must be a Python number or a %s tensor [%s], got %R",
                   name, want_names, dim, got);
    Py_XDECREF(got);
    return -1;
  }
  if (r != 0) return -1;
  if (is_alt != NULL) *is_alt = alt >= 0 && a.dt == alt;
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
  *v = (float)d; /* sample() has checked the range (its _float_param) */
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
      if (sample_array(q[fidx[i]], fnames[i], DT_F32, -1, "torch.float32", dev, n, per, &arr,
                       NULL) != 0)
        return -1;
      *farray[i] = (const float*)arr;
    }
  }
  if (PyLong_Check(q[TOPK])) {
    p->top_k = (int64_t)PyLong_AsLongLong(q[TOPK]);
    if (p->top_k == -1 && PyErr_Occurred()) return -1;
  } else {
    if (sample_array(q[TOPK], "top_k", DT_I32, DT_I64, "torch.int32 or torch.int64", dev, n, per,
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
      if (sample_array(u, unames[i], DT_I64, -1, "torch.int64", dev, n, per, &arr, NULL) != 0)
        return -1;
      *uarray[i] = (const uint64_t*)arr;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------- */
/* sample                                                                     */

/* _sample(logits, vocab_limit, temperature, top_k, top_p, min_p, seed, offset,
 *         out, out_logprobs[, want_logprobs]): dpsSample. Each parameter is a
 * Python number, the scalar for every row (sample() has normalized it: float
 * for temperature, top_p and min_p, int for top_k, an int in [0, 2^64) for
 * seed and offset), or a tensor [rows] whose device pointer goes into the
 * params' array field; the scalars' ranges are the library's to check
 * (dpsInvalidArgument names the argument). out / out_logprobs: the caller's
 * tensors, or None for the persistent outputs; want_logprobs (default:
 * out_logprobs is not None) asks for the logprobs. Returns the tokens, or
 * (tokens, logprobs). */
enum { S_X, S_LIMIT, S_TEMP, S_TOPK, S_TOPP, S_MINP, S_SEED, S_OFFSET, S_OUT, S_OUT_LP, S_WANT_LP,
       S_NARGS };

typedef struct {
  TArg a;
  int dt;
  int64_t vlimit;
  dpsSampleParams_t p;
  void *pt, *pl;
} SampleCall;

static dpsResult_t sample_call(dpsComm_t comm, void* ctx, struct CUstream_st* stream) {
  SampleCall* c = (SampleCall*)ctx;
  return dpsSample(comm, c->a.ptr, c->a.shape[0], c->a.shape[1], g_dtypes[c->dt].code, c->vlimit,
                   &c->p, (int64_t*)c->pt, (float*)c->pl, stream);
}

/* vocab_limit <= 0: the vocab size */
static int vocab_limit_arg(CommObject* self, PyObject* o, int64_t* v) {
  const long long limit = PyLong_AsLongLong(o);
  if (limit == -1 && PyErr_Occurred()) return -1;
  *v = limit > 0 ? (int64_t)limit : self->vocab;
  return 0;
}

static PyObject* sample_body(CommObject* self, Handle* h, PyObject* const* o) {
  if (torch_load() != 0) return NULL;
  SampleCall c = {0};
  c.p = (dpsSampleParams_t)DPS_SAMPLE_PARAMS_INITIALIZER;
  const int want_lp = o[S_WANT_LP] != NULL ? PyObject_IsTrue(o[S_WANT_LP]) : o[S_OUT_LP] != Py_None;
  if (want_lp < 0 || vocab_limit_arg(self, o[S_LIMIT], &c.vlimit) != 0) return NULL;
  if (logits_arg(self, o[S_X], &c.dt, &c.a) != 0) return NULL;
  const int64_t rows = c.a.shape[0];
  if (sample_params(&o[S_TEMP], self->device, rows, PER_ROW, &c.p) != 0) return NULL;
  PyObject *tok = NULL, *lp = NULL, *ret = NULL;
  if (out_tensor(self, o[S_OUT], "out", O_SAMPLE_TOKENS, DT_I64, rows, 0, &tok, &c.pt) != 0 ||
      (want_lp && out_tensor(self, o[S_OUT_LP], "out_logprobs", O_SAMPLE_LOGPROBS, DT_F32, rows,
                             0, &lp, &c.pl) != 0))
    goto done;
  if (op_launch(self, h, sample_call, &c) != 0) goto done;
  if (lp != NULL) {
    ret = PyTuple_Pack(2, tok, lp);
  } else {
    ret = tok;
    tok = NULL;
  }
done:
  Py_XDECREF(tok);
  Py_XDECREF(lp);
  return ret;
}

PyObject* comm_sample(CommObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != S_NARGS && nargs != S_NARGS - 1) {
    PyErr_Format(PyExc_TypeError, "_sample() takes %d or %d arguments (%zd given)", S_NARGS - 1,
                 S_NARGS, nargs);
    return NULL;
  }
  PyObject* a[S_NARGS];
  for (int i = 0; i < S_NARGS; ++i) a[i] = i < nargs ? args[i] : NULL;
  return comm_run(self, "sample", sample_body, a);
}

/* ------------------------------------------------------------------------- */
/* verify_chain                                                               */

/* _verify_chain(local_logits, candidates, pad_bs, vocab_limit, temperature,
 *               top_k, top_p, min_p, seed, offset, vocab_mask, softcap,
 *               return_logprobs): dpsVerifyChain. The parameters are
 * sample's, with tensors of pad_bs entries (one per request); verify_chain()
 * has normalized them and checked softcap (0: off). Returns the views of the
 * persistent outputs: (predict, accept_index, accept_length), plus logprobs
 * when return_logprobs. */
enum { VC_X, VC_CAND, VC_PAD, VC_LIMIT, VC_TEMP, VC_TOPK, VC_TOPP, VC_MINP, VC_SEED, VC_OFFSET,
       VC_MASK, VC_SOFTCAP, VC_WANT_LP, VC_NARGS };

typedef struct {
  TArg a;
  int dt, pad_bs, want_lp;
  int64_t vlimit;
  const int32_t* cand;
  const int32_t* mask;
  float softcap;
  dpsSampleParams_t p;
  int32_t *po, *aio, *alo;
  float* lpo;
} VerifyCall;

static dpsResult_t verify_call(dpsComm_t comm, void* ctx, struct CUstream_st* stream) {
  VerifyCall* c = (VerifyCall*)ctx;
  return dpsVerifyChain(comm, c->a.ptr, c->a.shape[0], c->a.shape[1], g_dtypes[c->dt].code,
                        c->vlimit, c->pad_bs, c->cand, &c->p, c->mask, c->softcap, &c->po,
                        &c->aio, &c->alo, c->want_lp ? &c->lpo : NULL, stream);
}

/* A 2-D int32 tensor argument of exactly [d0, d1]; `what` names the shape. */
static int int32_2d_arg(CommObject* self, PyObject* t, const char* name, int64_t d0, int64_t d1,
                        const char* what, const int32_t** ptr) {
  TArg m;
  if (typed_arg(t, name, self->device, DT_I32, 2, 0, &m) != 0) return -1;
  if (m.shape[0] != d0 || m.shape[1] != d1) {
    PyErr_Format(PyExc_ValueError, "%s has shape [%lld, %lld] but must be %s = [%lld, %lld]", name,
                 (long long)m.shape[0], (long long)m.shape[1], what, (long long)d0,
                 (long long)d1);
    return -1;
  }
  *ptr = (const int32_t*)m.ptr;
  return 0;
}

static PyObject* verify_body(CommObject* self, Handle* h, PyObject* const* o) {
  if (torch_load() != 0) return NULL;
  VerifyCall c = {0};
  c.p = (dpsSampleParams_t)DPS_SAMPLE_PARAMS_INITIALIZER;
  const double softcap = PyFloat_AsDouble(o[VC_SOFTCAP]);
  c.want_lp = PyObject_IsTrue(o[VC_WANT_LP]);
  if ((softcap == -1.0 && PyErr_Occurred()) || c.want_lp < 0 ||
      vocab_limit_arg(self, o[VC_LIMIT], &c.vlimit) != 0)
    return NULL;
  c.softcap = (float)softcap;
  if (pad_bs_arg(o[VC_PAD], -1, &c.pad_bs) != 0) return NULL;
  if (c.pad_bs > self->max_pad_bs) {
    PyErr_Format(PyExc_ValueError, "pad_bs=%d must be in [1, max_pad_bs=%d]", c.pad_bs,
                 self->max_pad_bs);
    return NULL;
  }
  const int n = self->n;
  const int64_t rows = (int64_t)c.pad_bs * n;
  if (logits_arg(self, o[VC_X], &c.dt, &c.a) != 0) return NULL;
  if (c.a.shape[0] != rows) {
    PyErr_Format(PyExc_ValueError,
                 "local_logits has %lld rows but pad_bs*num_tokens_per_req = %d*%d = %lld",
                 (long long)c.a.shape[0], c.pad_bs, n, (long long)rows);
    return NULL;
  }
  if (int32_2d_arg(self, o[VC_CAND], "candidates", c.pad_bs, n, "[pad_bs, num_tokens_per_req]",
                   &c.cand) != 0)
    return NULL;
  if (o[VC_MASK] != Py_None &&
      int32_2d_arg(self, o[VC_MASK], "vocab_mask", rows, (self->vocab + 31) / 32,
                   "[pad_bs*num_tokens_per_req, ceil(vocab_size/32)]", &c.mask) != 0)
    return NULL;
  if (sample_params(&o[VC_TEMP], self->device, c.pad_bs, PER_REQUEST, &c.p) != 0) return NULL;
  if (op_launch(self, h, verify_call, &c) != 0) return NULL;
  PyObject* t = outputs_view(self, h, V_VERIFY, c.po, c.aio, c.alo, c.pad_bs);
  if (t == NULL || !c.want_lp) return t;
  PyObject* l = logprobs_view(self, h, V_VERIFY_LP, c.lpo, c.pad_bs);
  PyObject* v = l == NULL ? NULL
                          : PyTuple_Pack(4, PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1),
                                         PyTuple_GET_ITEM(t, 2), l);
  Py_DECREF(t);
  Py_XDECREF(l);
  return v;
}

PyObject* comm_verify_chain(CommObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != VC_NARGS) {
    PyErr_Format(PyExc_TypeError, "_verify_chain() takes %d arguments (%zd given)", VC_NARGS,
                 nargs);
    return NULL;
  }
  return comm_run(self, "verify_chain", verify_body, args);
}

/* ------------------------------------------------------------------------- */
/* sample, verify_chain: the public methods                                   */

/* The common types of the sampling parameters, taken as _sample_params
 * (dpsampling/__init__.py) would normalize them; 0 when one is of another
 * kind or out of range, for the package's helper to normalize (or raise,
 * naming it) instead. q = (temperature, top_k, top_p, min_p, seed, offset)
 * as given (NULL: not given), out the same order normalized, new
 * references. */
static PyObject* s_one_f = NULL;  /* 1.0: top_p off */
static PyObject* s_zero_f = NULL; /* 0.0: min_p off, softcap off */

/* A float parameter: a tensor, or a float or int in [lo, hi], the values
 * the helper would pass unchanged (outside: it raises, or moves the value to
 * one that keeps its meaning in fp32). */
static int fast_float(PyObject* o, PyObject* off, double lo, double hi, PyObject** out) {
  if (o == NULL || o == Py_None) {
    if (off == NULL) return 0; /* temperature: required, a number */
    Py_INCREF(off);
    *out = off;
    return 1;
  }
  double d;
  if (PyFloat_CheckExact(o)) {
    d = PyFloat_AS_DOUBLE(o);
  } else if (PyLong_CheckExact(o)) {
    d = PyLong_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) { /* too large for a float: the helper names it */
      PyErr_Clear();
      return 0;
    }
  } else {
    if (!is_tensor(o)) return 0;
    d = lo;
  }
  if (!(d >= lo && d <= hi)) return 0; /* NaN too */
  Py_INCREF(o);
  *out = o;
  return 1;
}

/* top_k: an int in [-2^63, 2^63); seed, offset (wrap): an int in
 * [-2^63, 2^64) taken mod 2^64. None (top_k only) -> 0. */
static int fast_int(PyObject* o, int wrap, PyObject** out) {
  if (o == NULL || o == Py_None) {
    if (wrap) return 0;
    *out = PyLong_FromLong(0);
    return *out != NULL ? 1 : -1;
  }
  if (is_tensor(o)) {
    Py_INCREF(o);
    *out = o;
    return 1;
  }
  if (!PyLong_CheckExact(o)) return 0;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow < 0 || (overflow > 0 && !wrap)) return 0;
  if (overflow > 0) { /* [2^63, 2^64) as it is; beyond: the helper's ValueError */
    (void)PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return 0;
    }
  } else if (wrap && v < 0) {
    *out = PyLong_FromUnsignedLongLong((unsigned long long)v); /* v mod 2^64 */
    return *out != NULL ? 1 : -1;
  }
  Py_INCREF(o);
  *out = o;
  return 1;
}

enum { Q_TEMP, Q_TOPK, Q_TOPP, Q_MINP, Q_SEED, Q_OFFSET, Q_COUNT };

/* 1: every parameter normalized into out; 0: one is not of a common kind
 * (out left empty); -1: error. */
static int fast_params(PyObject* const* q, PyObject** out) {
  if (s_one_f == NULL && ((s_one_f = PyFloat_FromDouble(1.0)) == NULL ||
                          (s_zero_f = PyFloat_FromDouble(0.0)) == NULL))
    return -1;
  for (int i = 0; i < Q_COUNT; ++i) out[i] = NULL;
  int r = 1;
  /* the helper's order: temperature, top_p, min_p, top_k, seed, offset */
  /* the ranges of _temperature_scalar, _top_p_scalar, _min_p_scalar: fp32's
   * largest; its least positive; its greatest below 1 */
  if (r == 1) r = fast_float(q[Q_TEMP], NULL, 0.0, (double)FLT_MAX, &out[Q_TEMP]);
  if (r == 1) r = fast_float(q[Q_TOPP], s_one_f, 0x1p-149, 1.0, &out[Q_TOPP]);
  if (r == 1) r = fast_float(q[Q_MINP], s_zero_f, 0.0, 1.0 - 0x1p-24, &out[Q_MINP]);
  if (r == 1) r = fast_int(q[Q_TOPK], 0, &out[Q_TOPK]);
  if (r == 1) r = fast_int(q[Q_SEED], 1, &out[Q_SEED]);
  if (r == 1) r = fast_int(q[Q_OFFSET], 1, &out[Q_OFFSET]);
  if (r != 1)
    for (int i = 0; i < Q_COUNT; ++i) Py_CLEAR(out[i]);
  return r;
}

/* The helper's tuple (or NULL) into out[0..n), new references. */
static int unpack_helper(PyObject* t, PyObject** out, Py_ssize_t n, const char* name) {
  if (t == NULL) return -1;
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
    PyErr_Format(PyExc_RuntimeError, "dpsampling: helper '%s' returned %R", name, t);
    Py_DECREF(t);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyTuple_GET_ITEM(t, i);
    Py_INCREF(out[i]);
  }
  Py_DECREF(t);
  return 0;
}

const char doc_sample[] =
    "sample($self, /, local_logits, *, temperature, seed, offset, top_k=None, top_p=None, "
    "min_p=None, vocab_limit=None, return_logprobs=False, out=None, out_logprobs=None)\n--\n\n"
    "One token per row, drawn from this rank's [rows, V/tp] shard of the\n"
    "rows (every rank passes its shard of the same rows and the same\n"
    "parameters; every rank gets every row's token): int64 tokens [rows],\n"
    "or (tokens, logprobs fp32 [rows]) with return_logprobs=True, the raw\n"
    "log_softmax of the row at the token.\n\n"
    "Every parameter is a number, the same for every row, or a 1-D tensor\n"
    "[rows] on the logits' device: temperature, top_p, min_p float32;\n"
    "top_k int32 or int64; seed and offset int64 (its bits are the uint64\n"
    "values; a Python int may be in [-2^63, 2^64) and is taken mod 2^64).\n"
    "None turns a filter off (top_k <= 0, top_p = 1 and min_p = 0 do too).\n"
    "temperature 0 is greedy. The semantics (vLLM's filter order, exactly\n"
    "k kept for top-k, the Gumbel race on Philox noise keyed by seed,\n"
    "offset and the global index) are in docs/sampling.md. out /\n"
    "out_logprobs, when given, are written in place and returned; without\n"
    "them the outputs are views of the communicator's persistent outputs,\n"
    "valid until the next sample(). Either way the call allocates nothing\n"
    "(after the first call without out=) and is capturable in a CUDA graph\n"
    "as it is, with the parameter tensors read at replay. Invalid scalars\n"
    "raise ValueError naming them; an invalid entry of a parameter tensor\n"
    "is found on the device: that call writes nothing and sample_stats()\n"
    "reports it. At most 8 ranks (tp_size <= 8, as for argmax and topk):\n"
    "more raise RuntimeError.";

/* sample()'s arguments, as the method takes them (NULL: not given). */
enum { SA_X, SA_TEMP, SA_SEED, SA_OFFSET, SA_TOPK, SA_TOPP, SA_MINP, SA_LIMIT, SA_RETLP, SA_OUT,
       SA_OUTLP, SA_N };
/* Normalized: the params in Q order, then vocab_limit and want_logprobs. */
enum { SN_LIMIT = Q_COUNT, SN_WANT, SN_N };
_Static_assert(S_OFFSET - S_TEMP == Q_OFFSET - Q_TEMP && S_TOPP - S_TEMP == Q_TOPP,
               "sample()'s call arguments hold the parameters in Q order");

/* sample()'s arguments normalized into n (new references), as the package's
 * _sample_args does (its checks, in its order, raising its errors): the
 * common types here, everything else through the helper. x_any: take any
 * local_logits as a tensor (the CPU tests' hook, without torch). 0, or -1. */
static int sample_norm(PyObject* const* a, PyObject** n, int x_any) {
  PyObject* const q[Q_COUNT] = {a[SA_TEMP], a[SA_TOPK], a[SA_TOPP], a[SA_MINP], a[SA_SEED],
                                a[SA_OFFSET]};
  PyObject* rl = a[SA_RETLP] != NULL ? a[SA_RETLP] : Py_False;
  PyObject* out_lp = a[SA_OUTLP] != NULL ? a[SA_OUTLP] : Py_None;
  for (int i = 0; i < SN_N; ++i) n[i] = NULL;
  int r = fast_params(q, n);
  if (r < 0) return -1;
  if (r == 1) {
    PyObject* lim = a[SA_LIMIT];
    if (lim == NULL || lim == Py_None || PyLong_CheckExact(lim)) {
      /* an int < 1: limit_value's helper raises, as _limit_arg */
      if ((n[SN_LIMIT] = limit_value(lim)) == NULL) goto fail;
    } else {
      r = 0;
    }
  }
  int want = -1;
  if (r == 1 && out_lp != Py_None) {
    if ((want = PyObject_IsTrue(rl)) < 0) goto fail;
    if (!want) {
      PyErr_SetString(PyExc_ValueError,
                      "out_logprobs is given but return_logprobs=False; pass "
                      "return_logprobs=True to have the logprobs written");
      goto fail;
    }
  }
  if (r == 1 && !x_any && !is_tensor(a[SA_X])) r = 0; /* the helper's TypeError, or duck typing */
  if (r == 1) {
    if (want < 0 && (want = PyObject_IsTrue(rl)) < 0) goto fail;
    n[SN_WANT] = want ? Py_True : Py_False;
    Py_INCREF(n[SN_WANT]);
    return 0;
  }
  for (int i = 0; i < SN_N; ++i) Py_CLEAR(n[i]);
  /* -> (limit, temperature, top_k, top_p, min_p, seed, offset, want_lp) */
  PyObject* f = arg_helper("sample");
  PyObject* t = f == NULL ? NULL
                          : PyObject_CallFunctionObjArgs(
                                f, a[SA_X], q[Q_TEMP], q[Q_SEED], q[Q_OFFSET],
                                q[Q_TOPK] ? q[Q_TOPK] : Py_None, q[Q_TOPP] ? q[Q_TOPP] : Py_None,
                                q[Q_MINP] ? q[Q_MINP] : Py_None,
                                a[SA_LIMIT] ? a[SA_LIMIT] : Py_None, rl, out_lp, NULL);
  PyObject* u[SN_N];
  if (unpack_helper(t, u, SN_N, "sample") != 0) return -1;
  n[SN_LIMIT] = u[0];
  for (int i = 0; i < Q_COUNT; ++i) n[i] = u[1 + i];
  n[SN_WANT] = u[Q_COUNT + 1];
  return 0;
fail:
  for (int i = 0; i < SN_N; ++i) Py_CLEAR(n[i]);
  return -1;
}

static const char* const sample_names[] = {
    "local_logits", "temperature",     "seed", "offset",       "top_k", "top_p", "min_p",
    "vocab_limit",  "return_logprobs", "out",  "out_logprobs", NULL};

PyObject* comm_sample_m(CommObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  PyObject* a[SA_N];
  if (fast_args_pos("sample", sample_names, 4, 1, args, nargs, kw, a) != 0) return NULL;
  PyObject* n[SN_N];
  if (sample_norm(a, n, 0) != 0) return NULL;
  PyObject* o[S_NARGS];
  o[S_X] = a[SA_X];
  o[S_LIMIT] = n[SN_LIMIT];
  for (int q = 0; q < Q_COUNT; ++q) o[S_TEMP + q] = n[q]; /* S_TEMP.. S_OFFSET: Q order */
  o[S_OUT] = a[SA_OUT] != NULL ? a[SA_OUT] : Py_None;
  o[S_OUT_LP] = a[SA_OUTLP] != NULL ? a[SA_OUTLP] : Py_None;
  o[S_WANT_LP] = n[SN_WANT];
  PyObject* ret = comm_run(self, "sample", sample_body, o);
  for (int i = 0; i < SN_N; ++i) Py_DECREF(n[i]);
  return ret;
}

/* _test_sample_args(same arguments as sample() without self; local_logits
 * taken as a tensor whatever it is): what the method hands _sample, as
 * (vocab_limit, temperature, top_k, top_p, min_p, seed, offset,
 * want_logprobs), the helper's order: the CPU tests compare it with the
 * package's _sample_args. */
PyObject* m_test_sample_args(PyObject* m, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  (void)m;
  PyObject* a[SA_N];
  if (fast_args_pos("_test_sample_args", sample_names, 4, SA_N, args, nargs, kw, a) != 0)
    return NULL;
  PyObject* n[SN_N];
  if (sample_norm(a, n, 1) != 0) return NULL;
  PyObject* t = PyTuple_Pack(SN_N, n[SN_LIMIT], n[Q_TEMP], n[Q_TOPK], n[Q_TOPP], n[Q_MINP],
                             n[Q_SEED], n[Q_OFFSET], n[SN_WANT]);
  for (int i = 0; i < SN_N; ++i) Py_DECREF(n[i]);
  return t;
}

const char doc_verify_chain[] =
    "verify_chain($self, /, local_logits, candidates, *, pad_bs, temperature, seed, offset, "
    "top_k=None, top_p=None, min_p=None, vocab_limit=None, vocab_mask=None, softcap=None, "
    "return_logprobs=False)\n--\n\n"
    "The whole data-parallel chain verify (swap_batch_vocab, a verify\n"
    "of the full rows, gather_verify_outputs) in one call on this rank's\n"
    "[pad_bs*N, V/tp] shard (N = num_tokens_per_req; every rank passes\n"
    "its shard of the same rows and the same arguments; pad_bs need not\n"
    "be a multiple of tp_size): (predict, accept_index, accept_length),\n"
    "plus logprobs with return_logprobs=True, the full batch's outputs on\n"
    "every rank.\n\n"
    "Row b*N + j is request b's position j; every row is drawn as sample()\n"
    "draws it, with request b's parameters and offset[b] + j; then each\n"
    "request's chain is walked (docs/sampling.md, \"The walk and its outputs\"):\n"
    "candidates int32 [pad_bs, N] on the device holds request b's last\n"
    "accepted token (column 0: checked to be in [0, V), not compared)\n"
    "and its N-1 drafts; draft i is\n"
    "accepted while it equals the token of row b*N + i-1.\n"
    "predict / accept_index int32 [pad_bs, N], accept_length int32\n"
    "[pad_bs] (the bonus token counted), logprobs fp32 [pad_bs, N] (the\n"
    "raw log_softmax of the capped, masked row at each predict entry):\n"
    "unused entries are 0 (predict, logprobs) or -1 (accept_index);\n"
    "accept_index holds flat row indices b*N + j. They are views of the\n"
    "communicator's persistent buffers, valid until the next\n"
    "verify_chain() call.\n\n"
    "temperature, top_k, top_p, min_p, seed, offset, vocab_limit: as in\n"
    "sample(), but a tensor holds pad_bs entries, one per request.\n"
    "vocab_mask: None, or int32 [pad_bs*N, ceil(vocab_size/32)] on the\n"
    "device, the full-vocabulary mask of each row on every rank: bit i % 32\n"
    "of word i // 32 set = token i allowed. softcap: None or 0 (off), or\n"
    "c > 0 finite: every logit l becomes c * tanh(l / c) (fp32) before\n"
    "the mask and everything else. Invalid scalars raise ValueError naming\n"
    "them; wrong tensor shapes, dtypes or devices raise ValueError /\n"
    "TypeError naming the argument; an invalid entry of a parameter tensor\n"
    "is found on the device (nothing written, counted in sample_stats()).\n"
    "At most 8 ranks (tp_size <= 8): more raise RuntimeError.";

/* verify_chain()'s arguments, as the method takes them (NULL: not given). */
enum { VA_X, VA_CAND, VA_PAD, VA_TEMP, VA_SEED, VA_OFFSET, VA_TOPK, VA_TOPP, VA_MINP, VA_LIMIT,
       VA_MASK, VA_SOFTCAP, VA_RETLP, VA_N };
/* Normalized: the params in Q order, then pad_bs, vocab_limit, softcap,
 * want_logprobs. */
enum { VN_PAD = Q_COUNT, VN_LIMIT, VN_SOFTCAP, VN_WANT, VN_N };
_Static_assert(VC_OFFSET - VC_TEMP == Q_OFFSET - Q_TEMP && VC_TOPP - VC_TEMP == Q_TOPP,
               "verify_chain()'s call arguments hold the parameters in Q order");

/* verify_chain()'s arguments normalized into n (new references), as the
 * package's _verify_args does (x_any: as sample_norm). 0, or -1. */
static int verify_norm(PyObject* const* a, PyObject** n, int x_any) {
  PyObject* const q[Q_COUNT] = {a[VA_TEMP], a[VA_TOPK], a[VA_TOPP], a[VA_MINP], a[VA_SEED],
                                a[VA_OFFSET]};
  PyObject* rl = a[VA_RETLP] != NULL ? a[VA_RETLP] : Py_False;
  PyObject* pad = a[VA_PAD];
  for (int i = 0; i < VN_N; ++i) n[i] = NULL;
  int r = 1;
  if (PyLong_CheckExact(pad)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(pad, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < -(long long)INT32_MAX || v > INT32_MAX) r = 0;
  } else {
    r = 0;
  }
  if (r == 1) r = fast_params(q, n);
  if (r < 0) return -1;
  if (r == 1) {
    PyObject* lim = a[VA_LIMIT];
    if (lim == NULL || lim == Py_None || PyLong_CheckExact(lim)) {
      if ((n[VN_LIMIT] = limit_value(lim)) == NULL) goto fail;
    } else {
      r = 0;
    }
  }
  if (r == 1 && a[VA_SOFTCAP] != NULL && a[VA_SOFTCAP] != Py_None) r = 0; /* the helper's */
  if (r == 1 && !x_any && !is_tensor(a[VA_X])) r = 0;
  if (r == 1) {
    const int want = PyObject_IsTrue(rl);
    if (want < 0) goto fail;
    Py_INCREF(pad);
    n[VN_PAD] = pad;
    Py_INCREF(s_zero_f);
    n[VN_SOFTCAP] = s_zero_f;
    n[VN_WANT] = want ? Py_True : Py_False;
    Py_INCREF(n[VN_WANT]);
    return 0;
  }
  for (int i = 0; i < VN_N; ++i) Py_CLEAR(n[i]);
  /* -> (pad_bs, limit, temperature, top_k, top_p, min_p, seed, offset, softcap, want_lp) */
  PyObject* f = arg_helper("verify_chain");
  PyObject* t = f == NULL ? NULL
                          : PyObject_CallFunctionObjArgs(
                                f, a[VA_X], pad, q[Q_TEMP], q[Q_SEED], q[Q_OFFSET],
                                q[Q_TOPK] ? q[Q_TOPK] : Py_None, q[Q_TOPP] ? q[Q_TOPP] : Py_None,
                                q[Q_MINP] ? q[Q_MINP] : Py_None,
                                a[VA_LIMIT] ? a[VA_LIMIT] : Py_None,
                                a[VA_SOFTCAP] ? a[VA_SOFTCAP] : Py_None, rl, NULL);
  PyObject* u[VN_N];
  if (unpack_helper(t, u, VN_N, "verify_chain") != 0) return -1;
  n[VN_PAD] = u[0];
  n[VN_LIMIT] = u[1];
  for (int i = 0; i < Q_COUNT; ++i) n[i] = u[2 + i];
  n[VN_SOFTCAP] = u[2 + Q_COUNT];
  n[VN_WANT] = u[3 + Q_COUNT];
  return 0;
fail:
  for (int i = 0; i < VN_N; ++i) Py_CLEAR(n[i]);
  return -1;
}

static const char* const verify_names[] = {
    "local_logits", "candidates", "pad_bs",     "temperature", "seed",
    "offset",       "top_k",      "top_p",      "min_p",       "vocab_limit",
    "vocab_mask",   "softcap",    "return_logprobs", NULL};

PyObject* comm_verify_chain_m(CommObject* self, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kw) {
  PyObject* a[VA_N];
  if (fast_args_pos("verify_chain", verify_names, 6, 2, args, nargs, kw, a) != 0) return NULL;
  PyObject* n[VN_N];
  if (verify_norm(a, n, 0) != 0) return NULL;
  PyObject* o[VC_NARGS];
  o[VC_X] = a[VA_X];
  o[VC_CAND] = a[VA_CAND];
  o[VC_PAD] = n[VN_PAD];
  o[VC_LIMIT] = n[VN_LIMIT];
  for (int q = 0; q < Q_COUNT; ++q) o[VC_TEMP + q] = n[q]; /* VC_TEMP.. VC_OFFSET: Q order */
  o[VC_MASK] = a[VA_MASK] != NULL ? a[VA_MASK] : Py_None;
  o[VC_SOFTCAP] = n[VN_SOFTCAP];
  o[VC_WANT_LP] = n[VN_WANT];
  PyObject* ret = comm_run(self, "verify_chain", verify_body, o);
  for (int i = 0; i < VN_N; ++i) Py_DECREF(n[i]);
  return ret;
}

/* _test_verify_args(the arguments of verify_chain() without self): the
 * normalized (pad_bs, vocab_limit, temperature, top_k, top_p, min_p, seed,
 * offset, softcap, want_logprobs), the helper's order (CPU tests). */
PyObject* m_test_verify_args(PyObject* m, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  (void)m;
  PyObject* a[VA_N];
  if (fast_args_pos("_test_verify_args", verify_names, 6, VA_N, args, nargs, kw, a) != 0)
    return NULL;
  PyObject* n[VN_N];
  if (verify_norm(a, n, 1) != 0) return NULL;
  PyObject* t = PyTuple_Pack(VN_N, n[VN_PAD], n[VN_LIMIT], n[Q_TEMP], n[Q_TOPK], n[Q_TOPP],
                             n[Q_MINP], n[Q_SEED], n[Q_OFFSET], n[VN_SOFTCAP], n[VN_WANT]);
  for (int i = 0; i < VN_N; ++i) Py_DECREF(n[i]);
  return t;
}
