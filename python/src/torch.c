/* torch, loaded lazily (the first time a tensor crosses the boundary), its
 * current stream, tensor arguments coming in, and the methods' argument
 * parser. */
#include "binding.h"

/* torch, loaded on first use */
static int t_ready = 0;
PyObject* t_from_dlpack = NULL;            /* torch._C._from_dlpack */
PyObject* t_empty = NULL;                  /* torch.empty */
PyTypeObject* t_tensor_type = NULL;        /* torch.Tensor */
static PyObject* t_raw_stream = NULL;      /* torch._C._cuda_getCurrentRawStream, or NULL */
static PyObject* t_current_stream = NULL;  /* torch.cuda.current_stream (fallback) */

#define DPS_TORCH_MISSING                                                                  \
  "dpsampling needs PyTorch for tensors and communicators, and it is not installed: "    \
  "pip install 'dpsampling[torch]' (or a CUDA 13 build of torch, e.g. "                  \
  "pip install torch --index-url https://download.pytorch.org/whl/cu130)"

int torch_load(void) {
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
  if ((t_empty = PyObject_GetAttrString(torch, "empty")) == NULL) goto out;
  {
    PyObject* tt = PyObject_GetAttrString(torch, "Tensor");
    if (tt == NULL) goto out;
    if (!PyType_Check(tt)) {
      Py_DECREF(tt);
      PyErr_SetString(PyExc_TypeError, "torch.Tensor is not a type");
      goto out;
    }
    t_tensor_type = (PyTypeObject*)tt;
  }
  for (int i = 0; i < DT_COUNT; ++i)
    if ((t_dtypes[i] = PyObject_GetAttrString(torch, g_dtypes[i].torch_name)) == NULL) goto out;
  tensor_view_init();
  t_ready = 1;
  rc = 0;
out:
  Py_XDECREF(C);
  Py_DECREF(torch);
  return rc;
}

static int py_current_stream(int device, void** stream) {
  PyObject* r;
  PyObject* dev = PyLong_FromLong(device); /* a small int: no allocation */
  if (dev == NULL) return -1;
  if (t_raw_stream != NULL) {
    r = PyObject_CallOneArg(t_raw_stream, dev);
    Py_DECREF(dev);
  } else {
    PyObject* s = PyObject_CallOneArg(t_current_stream, dev);
    Py_DECREF(dev);
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

/* The API's answer once checked against Python's (the first call): a table
 * whose function does not give what torch.cuda.current_stream gives is not
 * used again. */
int current_stream(int device, void** stream) {
  static int checked = 0;
  if (checked && api_current_stream(device, stream)) return 0;
  if (py_current_stream(device, stream) != 0) return -1;
  if (!checked) {
    void* s = NULL;
    if (api_current_stream(device, &s)) {
      checked = 1;
      if (s != *stream) api_current_stream_off();
    }
  }
  return 0;
}

/* _current_stream(device): the stream the operations would be queued on
 * now, as an int (tests compare it with torch's). */
PyObject* m_current_stream(PyObject* mod, PyObject* dev) {
  (void)mod;
  const long d = PyLong_AsLong(dev);
  if (d == -1 && PyErr_Occurred()) return NULL;
  if (d < 0 || d > INT_MAX) {
    PyErr_Format(PyExc_ValueError, "_current_stream: device=%ld is not a CUDA device index", d);
    return NULL;
  }
  void* s = NULL;
  if (torch_load() != 0 || current_stream((int)d, &s) != 0) return NULL;
  return PyLong_FromVoidPtr(s);
}

/* ------------------------------------------------------------------------- */
/* Tensors in                                                                 */

static int long_of_call(PyObject* t, PyObject* meth, long long* v) {
  PyObject* r = PyObject_CallMethodNoArgs(t, meth);
  if (r == NULL) return -1;
  *v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int device_error(const char* name, long long dev, int device) {
  if (dev < 0)
    PyErr_Format(PyExc_ValueError, "%s must be a CUDA tensor on cuda:%d (the communicator's device), got a CPU tensor",
                 name, device);
  else
    PyErr_Format(PyExc_ValueError, "%s is on cuda:%lld but the communicator is on cuda:%d", name,
                 dev, device);
  return -1;
}

static int ndim_error(PyObject* t, const char* name, int want_ndim) {
  PyObject* shape = PyObject_GetAttr(t, s_shape);
  if (shape != NULL)
    PyErr_Format(PyExc_ValueError, "%s must be %d-D, got shape %R", name, want_ndim, shape);
  Py_XDECREF(shape);
  return -1;
}

static int contiguous_error(const char* name) {
  PyErr_Format(PyExc_ValueError, "%s must be contiguous (row-major); call .contiguous() first",
               name);
  return -1;
}

/* torch's is_contiguous(): row-major strides, dims of size 1 aside; no
 * elements is contiguous. */
static int view_contiguous(const TensorView* v) {
  if (v->strides == NULL) return 1;
  for (int i = 0; i < v->ndim; ++i)
    if (v->shape[i] == 0) return 1;
  int64_t want = 1;
  for (int i = v->ndim - 1; i >= 0; --i) {
    if (v->shape[i] == 1) continue;
    if (v->strides[i] != want) return 0;
    want *= v->shape[i];
  }
  return 1;
}

/* tensor_arg from the exchange API's view: the same checks, in the same
 * order, with the same messages. */
static int tensor_arg_view(const TensorView* v, PyObject* t, const char* name, int device,
                           unsigned dts, int want_ndim, int want_nbytes, TArg* a) {
  a->dt = dt_of_dl(v->dtype);
  if (dts != 0 && (a->dt < 0 || !(dts & DT_BIT(a->dt)))) return TARG_DTYPE;
  if (v->device != device) return device_error(name, v->device, device);
  a->ndim = v->ndim;
  if (want_ndim >= 0) {
    if (v->ndim != want_ndim) return ndim_error(t, name, want_ndim);
    for (int i = 0; i < want_ndim; ++i) a->shape[i] = v->shape[i];
  }
  if (!view_contiguous(v)) return contiguous_error(name);
  a->ptr = v->ptr;
  if (want_nbytes) {
    int64_t n = (int64_t)((v->dtype.bits * v->dtype.lanes + 7) / 8);
    for (int i = 0; i < v->ndim; ++i) n *= v->shape[i];
    a->nbytes = n;
  }
  return 0;
}

int tensor_arg(PyObject* t, const char* name, int device, unsigned dts, int want_ndim,
               int want_nbytes, TArg* a) {
  TensorView v;
  if (tensor_view(t, &v))
    return tensor_arg_view(&v, t, name, device, dts, want_ndim, want_nbytes, a);
  a->dt = -1;
  if (dts != 0) {
    if ((a->dt = tensor_dt(t, name)) == -2) return -1;
    if (a->dt < 0 || !(dts & DT_BIT(a->dt))) return TARG_DTYPE;
  }
  long long dev;
  if (long_of_call(t, s_get_device, &dev) != 0) return -1;
  if (dev != device) return device_error(name, dev, device);
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
      Py_DECREF(shape);
      return ndim_error(t, name, want_ndim);
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
  if (!contig) return contiguous_error(name);
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

int typed_arg(PyObject* t, const char* name, int device, Dt want, int want_ndim, int want_nbytes,
              TArg* a) {
  const int r = tensor_arg(t, name, device, DT_BIT(want), want_ndim, want_nbytes, a);
  return r == TARG_DTYPE ? dtype_error(t, name, want) : r;
}

long inferred_pad_bs(int64_t rows, int tp) {
  if (rows < 0 || tp < 1 || rows > INT32_MAX / tp) return -1;
  return (long)(rows * tp);
}

int pad_bs_arg(PyObject* o, long dflt, int* pad_bs) {
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

int fast_args(const char* fname, const char* const* names, int nreq, PyObject* const* args,
              Py_ssize_t nargs, PyObject* kwnames, PyObject** out) {
  return fast_args_pos(fname, names, nreq, -1, args, nargs, kwnames, out);
}

int fast_alias(const char* fname, const char* const* names, PyObject** out, int i, int alias) {
  if (out[alias] != NULL) {
    if (out[i] != NULL) {
      PyErr_Format(PyExc_TypeError, "%s() got both '%s' and its other name '%s'", fname, names[i],
                   names[alias]);
      return -1;
    }
    out[i] = out[alias];
  }
  if (out[i] == NULL) {
    PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fname, names[i],
                 i + 1);
    return -1;
  }
  return 0;
}

/* The interned str of every name of a method's (static) names array, made
 * on the array's first call with keywords: the keywords of a call site are
 * interned strs, so one pointer compare finds each before any string
 * compare. NULL when the cache is full or a name cannot be interned (the
 * string compares then do it all). The GIL guards the cache. */
enum { KW_ARRAYS = 32, KW_NAMES = 16 };
static struct {
  const char* const* names;
  PyObject* s[KW_NAMES];
} kw_interned[KW_ARRAYS];

static PyObject* const* interned_names(const char* const* names, int n) {
  if (n > KW_NAMES) return NULL;
  for (int i = 0; i < KW_ARRAYS; ++i) {
    if (kw_interned[i].names == names) return kw_interned[i].s;
    if (kw_interned[i].names != NULL) continue;
    for (int j = 0; j < n; ++j) {
      if ((kw_interned[i].s[j] = PyUnicode_InternFromString(names[j])) == NULL) {
        PyErr_Clear();
        for (int k = 0; k < j; ++k) Py_CLEAR(kw_interned[i].s[k]);
        return NULL;
      }
    }
    kw_interned[i].names = names;
    return kw_interned[i].s;
  }
  return NULL;
}

int fast_args_pos(const char* fname, const char* const* names, int nreq, int npos,
                  PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) {
  int n = 0;
  while (names[n] != NULL) ++n;
  if (npos >= 0 && nargs > npos) { /* as Python counts them: self included */
    PyErr_Format(PyExc_TypeError, "%s() takes %d positional argument%s but %zd were given", fname,
                 npos + 1, npos == 0 ? "" : "s", nargs + 1);
    return -1;
  }
  if (nargs > n) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n, nargs);
    return -1;
  }
  for (int i = 0; i < n; ++i) out[i] = i < nargs ? args[i] : NULL;
  const Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject* const* interned = nkw > 0 ? interned_names(names, n) : NULL;
  for (Py_ssize_t j = 0; j < nkw; ++j) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, j);
    int i = 0;
    if (interned != NULL)
      while (i < n && interned[i] != key) ++i;
    if (interned == NULL || i == n) /* a str made at run time, e.g. **kwargs */
      for (i = 0; i < n && PyUnicode_CompareWithASCIIString(key, names[i]) != 0;) ++i;
    if (i == n) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
      return -1;
    }
    if (out[i] != NULL) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                   names[i]);
      return -1;
    }
    out[i] = args[nargs + j];
  }
  for (int i = 0; i < nreq; ++i) {
    if (out[i] == NULL) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fname,
                   names[i], i + 1);
      return -1;
    }
  }
  return 0;
}
