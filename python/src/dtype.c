/* Tensor dtypes: the one table of every dtype the binding handles (torch's
 * object, the library's code, the DLPack type, the element size, the names
 * a logits dtype may be given by), and the lookups over it. */
#include "binding.h"

const DtypeInfo g_dtypes[DT_COUNT] = {
    [DT_F32] = {"float32", dpsFloat32, {kDLFloat, 32, 1}, 4, {"fp32", "float32", "float", NULL}},
    [DT_BF16] = {"bfloat16", dpsBfloat16, {kDLBfloat, 16, 1}, 2, {"bf16", "bfloat16", NULL}},
    [DT_F16] = {"float16", dpsFloat16, {kDLFloat, 16, 1}, 2, {"fp16", "float16", "half", NULL}},
    [DT_I32] = {"int32", dpsDtypeUnset, {kDLInt, 32, 1}, 4, {NULL}},
    [DT_I64] = {"int64", dpsDtypeUnset, {kDLInt, 64, 1}, 8, {NULL}},
    [DT_U8] = {"uint8", dpsDtypeUnset, {kDLUInt, 8, 1}, 1, {NULL}},
};

PyObject* t_dtypes[DT_COUNT];

int dt_of_code(dpsDataType_t code) {
  if (code == dpsDtypeUnset) return -1;
  for (int i = 0; i < DT_COUNT; ++i)
    if (g_dtypes[i].code == code) return i;
  return -1;
}

int dt_of_dl(DLDataType d) {
  for (int i = 0; i < DT_COUNT; ++i)
    if (g_dtypes[i].dl.code == d.code && g_dtypes[i].dl.bits == d.bits &&
        g_dtypes[i].dl.lanes == d.lanes)
      return i;
  return -1;
}

int dt_of_torch(PyObject* dtype) {
  for (int i = 0; i < DT_COUNT; ++i)
    if (t_dtypes[i] == dtype) return i;
  return -1;
}

/* "torch.float32, torch.bfloat16 or torch.float16" and "'fp32', 'float32',
 * ..., 'half'": the logits dtypes as messages name them. */
static PyObject* logits_dtype_list(int quoted_names) {
  PyObject* parts = PyList_New(0);
  if (parts == NULL) return NULL;
  for (int i = 0; i < DT_COUNT; ++i) {
    if (g_dtypes[i].code == dpsDtypeUnset) continue;
    for (int j = 0; quoted_names ? g_dtypes[i].names[j] != NULL : j < 1; ++j) {
      PyObject* s = quoted_names ? PyUnicode_FromFormat("'%s'", g_dtypes[i].names[j])
                                 : PyUnicode_FromFormat("torch.%s", g_dtypes[i].torch_name);
      if (s == NULL || PyList_Append(parts, s) != 0) {
        Py_XDECREF(s);
        Py_DECREF(parts);
        return NULL;
      }
      Py_DECREF(s);
    }
  }
  PyObject* sep = PyUnicode_FromString(", ");
  PyObject* all = sep != NULL ? PyUnicode_Join(sep, parts) : NULL;
  Py_XDECREF(sep);
  Py_DECREF(parts);
  return all;
}

int dtype_code_of(PyObject* o, int allow_none, const char* name) {
  if (o == Py_None && allow_none) return dpsDtypeUnset;
  if (PyUnicode_Check(o)) {
    const char* s = PyUnicode_AsUTF8(o);
    if (s == NULL) return -2;
    if (strncmp(s, "torch.", 6) == 0) s += 6;
    for (int i = 0; i < DT_COUNT; ++i)
      for (int j = 0; g_dtypes[i].names[j] != NULL; ++j)
        if (strcmp(s, g_dtypes[i].names[j]) == 0) return (int)g_dtypes[i].code;
  } else if (strcmp(Py_TYPE(o)->tp_name, "torch.dtype") == 0) {
    if (torch_load() != 0) return -2;
    const int dt = dt_of_torch(o);
    if (dt >= 0 && g_dtypes[dt].code != dpsDtypeUnset) return (int)g_dtypes[dt].code;
  }
  PyObject* types = logits_dtype_list(0);
  PyObject* names = types != NULL ? logits_dtype_list(1) : NULL;
  if (names != NULL)
    PyErr_Format(PyExc_TypeError,
                 "%s=%R is not a supported logits dtype; expected one of %U, or one of the names "
                 "%U (each also with a 'torch.' prefix)%s",
                 name, o, types, names, allow_none ? ", or None" : "");
  Py_XDECREF(types);
  Py_XDECREF(names);
  return -2;
}

int tensor_dt(PyObject* t, const char* name) {
  PyObject* dt = PyObject_GetAttr(t, s_dtype);
  if (dt == NULL) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s must be a torch.Tensor, got %.200s", name,
                 Py_TYPE(t)->tp_name);
    return -2;
  }
  const int i = dt_of_torch(dt);
  Py_DECREF(dt);
  return i;
}

int dtype_error(PyObject* t, const char* name, Dt want) {
  PyObject* got = PyObject_GetAttr(t, s_dtype);
  if (got != NULL)
    PyErr_Format(PyExc_TypeError, "%s must be torch.%s, got %R", name, g_dtypes[want].torch_name,
                 got);
  Py_XDECREF(got);
  return -1;
}

int logits_dtype_error(PyObject* t, const char* name) {
  PyObject* got = PyObject_GetAttr(t, s_dtype);
  PyObject* types = got != NULL ? logits_dtype_list(0) : NULL;
  if (types != NULL)
    PyErr_Format(PyExc_TypeError, "%s dtype %R is not supported; expected one of %U", name, got,
                 types);
  Py_XDECREF(got);
  Py_XDECREF(types);
  return -1;
}
