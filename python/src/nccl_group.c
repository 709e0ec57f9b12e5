/* NcclGroup: the library's own NCCL communicator for one group, shared (as a
 * refcounted SharedNccl) by every communicator created on that group. */
#include "binding.h"

void shared_nccl_retain(SharedNccl* s) { __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED); }

void shared_nccl_release(SharedNccl* s) {
  if (s == NULL) return;
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  free(s);
}

/* ------------------------------------------------------------------------- */
/* NcclGroup: one NCCL communicator per group                                 */

static int ncclgroup_init(NcclGroupObject* self, PyObject* args, PyObject* kw) {
  static char* kwlist[] = {"unique_id", "nranks", "rank", "device", NULL};
  Py_buffer uid;
  int nranks, rank, device;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*iii:NcclGroup", kwlist, &uid, &nranks, &rank,
                                   &device))
    return -1;
  if (self->s != NULL || self->initializing) {
    PyBuffer_Release(&uid);
    PyErr_SetString(PyExc_RuntimeError, self->initializing
                                            ? "NcclGroup is being initialized by another thread"
                                            : "NcclGroup is already initialized");
    return -1;
  }
  if (uid.len != (Py_ssize_t)sizeof(dpsUniqueId)) {
    PyErr_Format(PyExc_ValueError, "unique_id must be %zu bytes, got %zd", sizeof(dpsUniqueId),
                 uid.len);
    PyBuffer_Release(&uid);
    return -1;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks || device < 0) {
    PyBuffer_Release(&uid);
    PyErr_Format(PyExc_ValueError, "NcclGroup: nranks=%d rank=%d device=%d out of range", nranks,
                 rank, device);
    return -1;
  }
  ncclUniqueId id;
  memcpy(&id, uid.buf, sizeof id); /* dpsUniqueId carries an ncclUniqueId */
  PyBuffer_Release(&uid);
  ncclComm_t comm = NULL;
  ncclResult_t nr = ncclSuccess;
  cudaError_t ce;
  self->initializing = 1; /* a second __init__ meanwhile must not start another */
  Py_BEGIN_ALLOW_THREADS;
  DevGuard g;
  ce = dev_enter(&g, device);
  if (ce == cudaSuccess) {
    nr = ncclCommInitRank(&comm, nranks, id, rank);
    dev_leave(&g);
  }
  Py_END_ALLOW_THREADS;
  self->initializing = 0;
  if (ce != cudaSuccess) {
    PyErr_Format(PyExc_RuntimeError, "cudaSetDevice(%d) failed: %s", device, cudaGetErrorString(ce));
    return -1;
  }
  if (nr != ncclSuccess) {
    PyErr_Format(PyExc_RuntimeError, "ncclCommInitRank(nranks=%d, rank=%d, device=%d) failed: %s",
                 nranks, rank, device, ncclGetErrorString(nr));
    return -1;
  }
  SharedNccl* s = (SharedNccl*)calloc(1, sizeof *s);
  if (s == NULL) {
    ncclCommDestroy(comm);
    PyErr_NoMemory();
    return -1;
  }
  s->refs = 1;
  s->comm = comm;
  s->device = device;
  s->nranks = nranks;
  s->rank = rank;
  self->s = s;
  return 0;
}

/* Collective (every rank together): destroys the group's NCCL
 * communicator. Refused while a communicator created on it is open. */
static PyObject* ncclgroup_destroy(NcclGroupObject* self, PyObject* unused) {
  (void)unused;
  SharedNccl* s = self->s;
  if (s == NULL || s->comm == NULL) Py_RETURN_NONE;
  const long users = __atomic_load_n(&s->open_users, __ATOMIC_ACQUIRE);
  if (users > 0) {
    PyErr_Format(PyExc_RuntimeError,
                 "destroy_group_communicators: %ld DpSamplingComm(s) on group (rank %d of %d) "
                 "are still open; close() them first (nothing was destroyed)",
                 users, s->rank, s->nranks);
    return NULL;
  }
  ncclComm_t c = s->comm;
  s->comm = NULL;
  Py_BEGIN_ALLOW_THREADS;
  DevGuard g;
  if (dev_enter(&g, s->device) == cudaSuccess) {
    ncclCommDestroy(c);
    dev_leave(&g);
  }
  Py_END_ALLOW_THREADS;
  Py_RETURN_NONE;
}

static PyObject* ncclgroup_open_users(NcclGroupObject* self, PyObject* unused) {
  (void)unused;
  return PyLong_FromLong(self->s ? __atomic_load_n(&self->s->open_users, __ATOMIC_ACQUIRE) : 0);
}

static PyMethodDef ncclgroup_methods[] = {
    {"destroy", (PyCFunction)ncclgroup_destroy, METH_NOARGS,
     "destroy($self, /)\n--\n\nDestroy the group's NCCL communicator (collective); refused while "
     "a communicator on it is open."},
    {"open_users", (PyCFunction)ncclgroup_open_users, METH_NOARGS,
     "open_users($self, /)\n--\n\nHow many communicators on this group are not closed."},
    {NULL, NULL, 0, NULL}};

static void ncclgroup_dealloc(NcclGroupObject* self) {
  shared_nccl_release(self->s);
  self->s = NULL;
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* ncclgroup_get(NcclGroupObject* self, void* which) {
  if (self->s == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "NcclGroup is not initialized");
    return NULL;
  }
  switch ((int)(intptr_t)which) {
    case 0: return PyLong_FromLong(self->s->nranks);
    case 1: return PyLong_FromLong(self->s->rank);
    default: return PyLong_FromLong(self->s->device);
  }
}

static PyGetSetDef ncclgroup_getset[] = {
    {"nranks", (getter)ncclgroup_get, NULL, "ranks in the group", (void*)0},
    {"rank", (getter)ncclgroup_get, NULL, "this process's rank in the group", (void*)1},
    {"device", (getter)ncclgroup_get, NULL, "CUDA device of the communicator", (void*)2},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject NcclGroupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dpsampling._dpsampling.NcclGroup",
    .tp_basicsize = sizeof(NcclGroupObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NcclGroup(unique_id: bytes, nranks, rank, device): the library's own NCCL "
              "communicator for one group (ncclCommInitRank; collective).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ncclgroup_init,
    .tp_dealloc = (destructor)ncclgroup_dealloc,
    .tp_getset = ncclgroup_getset,
    .tp_methods = ncclgroup_methods,
};

NcclGroupObject* lookup_group(PyObject* group) {
  if (g_registry != NULL && group != Py_None && PyTuple_CheckExact(group)) {
    PyObject* item = PyDict_GetItemWithError(g_registry, group);
    if (item != NULL && Py_IS_TYPE(item, &NcclGroupType) && ((NcclGroupObject*)item)->s != NULL &&
        ((NcclGroupObject*)item)->s->comm != NULL) {
      Py_INCREF(item);
      return (NcclGroupObject*)item;
    }
    if (PyErr_Occurred()) return NULL;
  }
  if (g_resolver == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "dpsampling: no group resolver installed");
    return NULL;
  }
  PyObject* r = PyObject_CallOneArg(g_resolver, group);
  if (r == NULL) return NULL;
  if (!Py_IS_TYPE(r, &NcclGroupType) || ((NcclGroupObject*)r)->s == NULL ||
      ((NcclGroupObject*)r)->s->comm == NULL) {
    Py_DECREF(r);
    PyErr_SetString(PyExc_RuntimeError, "dpsampling: the group resolver did not return an NcclGroup");
    return NULL;
  }
  return (NcclGroupObject*)r;
}
