/* The sampling operations of Comm: sample and verify_chain, and their
 * parameters (a Python number for every row, or a tensor of one entry per
 * row or request). */
#include "binding.h"

/* The length of a parameter tensor: one entry per row (sample: `n` rows of
 * local_logits) or per request (verify_chain: n == pad_bs). */
typedef enum { PER_ROW, PER_REQUEST } ParamsPer;

/* One tensor parameter: dtype (want, or the row alt when alt >= 0), 1-D, `n`
 * long, contiguous, on the communicator's device. *is_alt says which dtype. */
static int sample_array(PyObject* t, const char* name, Dt want, int alt, const char* want_names,
                        int device, int64_t n, ParamsPer per, const void** ptr, int* is_alt) {
  const char* dim = per == PER_ROW ? "rows" : "pad_bs";
  const int dt = tensor_dt(t, name);
  if (dt == -2) return -1;
  if (dt != (int)want && (alt < 0 || dt != alt)) {
    PyObject* got = PyObject_GetAttr(t, s_dtype);
    if (got != NULL)
      PyErr_Format(PyExc_TypeError, "%s must be a Python number or a %s tensor [%s], got %R",
                   name, want_names, dim, got);
    Py_XDECREF(got);
    return -1;
  }
  if (is_alt != NULL) *is_alt = alt >= 0 && dt == alt;
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
  if (expect_dt(t, name, DT_I32) != 0 || tensor_arg(t, name, self->device, 2, 0, &m) != 0)
    return -1;
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
