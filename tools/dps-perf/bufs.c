/* dps-perf: the buffers of a case, owned by the harness (dps_perf.h says
 * how an operation declares them): the host inputs of steps 1 and 2, the
 * device buffers, the uploads and poisoning at every fill, the copies back
 * before every check, and the frees. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Zeroed host memory remembered in *m (freed with it); NULL when m is full
 * or out of host memory. */
static void* memAdd(DpMemList* m, size_t bytes) {
  if (m->n >= DP_MAX_MEM) return NULL;
  void* p = calloc(1, bytes ? bytes : 1);
  if (p) m->p[m->n++] = p;
  return p;
}

static void memFree(DpMemList* m) {
  for (int i = 0; i < m->n; ++i) free(m->p[i]);
  m->n = 0;
}

/* ---- host side (host_init) -------------------------------------------------------- */

void* dpHostMem(DpHost* h, size_t bytes) { return memAdd(&h->mem, bytes); }

int dpHostIn(DpHost* h, size_t bytes, int per_step) {
  if (h->nin >= DP_MAX_BUFS) return -1;
  void* s1 = dpHostMem(h, bytes);
  void* s2 = per_step ? dpHostMem(h, bytes) : s1;
  if (!s1 || !s2) return -1;
  const int i = h->nin++;
  h->in[i].step[0] = s1;
  h->in[i].step[1] = s2;
  h->in[i].bytes = bytes;
  return i;
}

void dpHostFree(DpHost* h) {
  memFree(&h->mem);
  h->nin = 0;
  h->op = NULL;
}

/* ---- device side (setup) ---------------------------------------------------------- */

/* A new entry of b, or -1 when a declaration failed before or the table is
 * full (recorded in *l). */
static int newBuf(DpBufs* b, size_t bytes, DpLocal* l) {
  if (l->status != DP_OK) return -1;
  if (b->n >= DP_MAX_BUFS) {
    dpSetLocal(l, DP_ERR, "more than %d buffers in one case", DP_MAX_BUFS);
    return -1;
  }
  const int i = b->n++;
  memset(&b->b[i], 0, sizeof b->b[i]);
  b->b[i].bytes = bytes;
  b->b[i].input = -1;
  b->b[i].poison = -1;
  return i;
}

void* dpMem(DpBufs* b, size_t bytes, DpLocal* l) {
  if (l->status != DP_OK) return NULL;
  void* p = memAdd(&b->mem, bytes);
  if (p == NULL) dpSetLocal(l, DP_ERR, "out of host memory (%zu bytes)", bytes);
  return p;
}

void* dpState(DpBufs* b, size_t bytes, DpLocal* l) {
  b->op = dpMem(b, bytes, l);
  return b->op;
}

void* dpDevTmp(DpBufs* b, size_t bytes, DpLocal* l) {
  const int i = newBuf(b, bytes, l);
  if (i < 0) return NULL;
  DP_TRY_CUDA(l, cudaMalloc(&b->b[i].dev, bytes), fail);
  return b->b[i].dev;
fail:
  return NULL;
}

void* dpDevIn(DpBufs* b, const DpHost* h, int input, DpLocal* l) {
  void* d = dpDevTmp(b, h->in[input].bytes, l);
  if (d) b->b[b->n - 1].input = input;
  return d;
}

DpOut dpDevOut(DpBufs* b, size_t bytes, int poison, DpLocal* l) {
  DpOut o = {dpDevTmp(b, bytes, l), NULL};
  void* hc = o.dev ? dpMem(b, bytes, l) : NULL;
  if (!hc) return (DpOut){NULL, NULL};
  b->b[b->n - 1].poison = poison;
  b->b[b->n - 1].host = hc;
  o.host = hc;
  return o;
}

void* dpLibOut(DpBufs* b, const void* slot, size_t bytes, DpLocal* l) {
  const int i = newBuf(b, bytes, l);
  void* hc = i >= 0 ? dpMem(b, bytes, l) : NULL;
  if (!hc) return NULL;
  b->b[i].slot = slot;
  b->b[i].host = hc;
  return hc;
}

/* ---- the harness's side (run.c) ------------------------------------------------------ */

int dpUpload(const DpBufs* b, const DpHost* h, int step, cudaStream_t s, DpLocal* l) {
  for (int i = 0; i < b->n; ++i) {
    const int in = b->b[i].input;
    if (in >= 0)
      DP_TRY_CUDA(l, cudaMemcpyAsync(b->b[i].dev, h->in[in].step[step - 1], h->in[in].bytes,
                                     cudaMemcpyHostToDevice, s),
                  fail);
  }
  /* outputs a call did not write show up as wrong (an invalid index, NaN) */
  for (int i = 0; i < b->n; ++i)
    if (b->b[i].poison >= 0)
      DP_TRY_CUDA(l, cudaMemsetAsync(b->b[i].dev, b->b[i].poison, b->b[i].bytes, s), fail);
  return 0;
fail:
  return 1;
}

int dpFetch(DpBufs* b, const char* op, cudaStream_t s, DpLocal* l) {
  for (int i = 0; i < b->n; ++i) {
    if (!b->b[i].host) continue;
    const void* src = b->b[i].dev;
    if (b->b[i].slot) {
      memcpy(&src, b->b[i].slot, sizeof src); /* the library's pointer, as run stored it */
      if (src == NULL) {
        dpSetLocal(l, DP_ERR, "%s: the call returned a NULL output pointer", op);
        return 1;
      }
    }
    DP_TRY_CUDA(l, cudaMemcpyAsync(b->b[i].host, src, b->b[i].bytes, cudaMemcpyDeviceToHost, s),
                fail);
  }
  DP_TRY_CUDA(l, cudaStreamSynchronize(s), fail);
  return 0;
fail:
  return 1;
}

void dpBufsFree(DpBufs* b) {
  for (int i = 0; i < b->n; ++i)
    if (b->b[i].dev) cudaFree(b->b[i].dev);
  b->n = 0;
  memFree(&b->mem);
  b->op = NULL;
}
