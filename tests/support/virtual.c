/* The virtual-rank provider: tp ranks of one group in one process, on one
 * GPU, a host thread each (testsupport.h). What NCCL does between processes
 * is done here between threads:
 *  - exchange: every rank posts its words, all meet, all read, all meet;
 *  - symmetric memory: the library's own device allocation; registration
 *    posts each rank's base address and every rank reads all of them, so a
 *    rank's "peer pointers" are the other ranks' allocations on the same
 *    device. Freeing it only hands it to the group, which frees it when it
 *    ends (see vgSymFree);
 *  - collectives (nccl backend): each rank records "send ready" on its
 *    stream, all meet, each copies every peer's chunk on its own stream
 *    behind that peer's event and records "copies done", all meet again, and
 *    each stream waits for every other rank's "copies done" (so no sender
 *    reuses its buffer while a peer still reads it). During a capture the
 *    events join the ranks' streams into one graph. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testsupport.h"

#define VG_MAX_RANKS DPS_PROVIDER_MAX_RANKS
#define VG_MAX_WORDS 64 /* int64 words per rank and exchange */
#define VG_MAX_KEPT (4 * VG_MAX_RANKS) /* symmetric allocations kept until the group ends */

struct dpsVirtualGroup {
  int tp, barrier_s;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int count, gen, abort;
  int64_t words[VG_MAX_RANKS][VG_MAX_WORDS];
  void* base[VG_MAX_RANKS];
  /* collectives */
  const void* send[VG_MAX_RANKS];
  size_t bytes[VG_MAX_RANKS];
  cudaEvent_t ready[VG_MAX_RANKS], done[VG_MAX_RANKS];
  /* symmetric memory its ranks freed (vgSymFree) */
  void* kept[VG_MAX_KEPT];
  int nkept;
};

static dpsVirtualGroup* groupOf(dpsComm_t comm) { return (dpsVirtualGroup*)comm->prov_ctx; }

void dpsVirtualGroupAbort(dpsVirtualGroup* g) {
  pthread_mutex_lock(&g->mu);
  g->abort = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

int dpsVirtualBarrier(dpsVirtualGroup* g) {
  pthread_mutex_lock(&g->mu);
  if (g->abort) {
    pthread_mutex_unlock(&g->mu);
    return 1;
  }
  const int gen = g->gen;
  if (++g->count == g->tp) {
    g->count = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 0;
  }
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += g->barrier_s;
  while (g->gen == gen && !g->abort) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT && g->gen == gen) {
      fprintf(stderr, "virtual group of %d ranks: host barrier timed out after %d s\n", g->tp,
              g->barrier_s);
      g->abort = 1;
      pthread_cond_broadcast(&g->cv);
    }
  }
  const int rc = g->gen == gen ? 1 : 0;
  pthread_mutex_unlock(&g->mu);
  return rc;
}

static dpsResult_t barrierOr(dpsVirtualGroup* g, const char* step) {
  if (dpsVirtualBarrier(g) == 0) return dpsSuccess;
  return dpsSetError(dpsSystemError, "virtual group: %s: another rank failed (group aborted)",
                     step);
}

static int vgReachable(dpsComm_t comm) {
  (void)comm;
  return 1; /* one device: every rank's memory is load/store reachable */
}

static dpsResult_t vgExchange(dpsComm_t comm, const int64_t* mine, int64_t* all, int count) {
  dpsVirtualGroup* g = groupOf(comm);
  const int me = comm->config.rank;
  if (count > VG_MAX_WORDS)
    return dpsSetError(dpsInternalError, "virtual group: exchange of %d words (max %d)", count,
                       VG_MAX_WORDS);
  memcpy(g->words[me], mine, sizeof(int64_t) * (size_t)count);
  DPS_CHECK(barrierOr(g, "exchange"));
  for (int r = 0; r < g->tp; ++r)
    memcpy(all + (size_t)r * (size_t)count, g->words[r], sizeof(int64_t) * (size_t)count);
  return barrierOr(g, "exchange");
}

static void vgFinish(dpsComm_t comm, int failed) {
  (void)comm;
  (void)failed;
}

static dpsResult_t vgSymAlloc(dpsComm_t comm, dpsSymMem* m, size_t bytes, const char* what) {
  memset(m, 0, sizeof *m);
  DPS_CHECK(dpsDeviceAlloc(comm, &m->base, bytes, what));
  m->size = bytes < 16 ? 16 : bytes;
  return dpsSuccess;
}

static dpsResult_t vgSymRegister(dpsComm_t comm, dpsSymMem* m, const char* what) {
  (void)what;
  dpsVirtualGroup* g = groupOf(comm);
  g->base[comm->config.rank] = m->base;
  DPS_CHECK(barrierOr(g, "window registration"));
  for (int r = 0; r < g->tp; ++r) m->peer[r] = (char*)g->base[r];
  DPS_CHECK(barrierOr(g, "window registration"));
  m->registered = 1;
  return dpsSuccess;
}

static void vgSymDeregister(dpsComm_t comm, dpsSymMem* m) {
  if (!m->registered) return;
  (void)dpsVirtualBarrier(groupOf(comm)); /* collective, as NCCL's */
  m->registered = 0;
}

/* Local and capture-safe: no CUDA call, the memory stays allocated until
 * the group ends, as NCCL's windows stay mapped while a registration holds
 * them (backends/nccl_provider.c, npSymFree). A peer may still store into
 * a rank's window after that rank's teardown: after a failure the ranks
 * that gave up skip the close exchange and free at once, while a rank that
 * did not give up runs its exchange kernel, which stores into every peer's
 * staging before it notices their failure marks. Here the peers' memory is
 * this process's own: freed (and returned by the pool at the next
 * synchronization), such a store would be an illegal address that ends the
 * context for every later test. */
static void vgSymFree(dpsComm_t comm, dpsSymMem* m) {
  m->registered = 0;
  if (m->base == NULL) return;
  dpsVirtualGroup* g = groupOf(comm);
  pthread_mutex_lock(&g->mu); /* another rank's thread may free its own now */
  const int keep = g->nkept < VG_MAX_KEPT;
  if (keep) g->kept[g->nkept++] = m->base;
  pthread_mutex_unlock(&g->mu);
  if (keep) m->base = NULL;
  else dpsDeviceFree(comm, &m->base); /* not expected: 2 allocations per rank */
}

static dpsResult_t vgCopy(dpsComm_t comm, const void* send, void* recv, size_t bytes, int a2a,
                          int skip, cudaStream_t stream) {
  dpsVirtualGroup* g = groupOf(comm);
  const int me = comm->config.rank;
  g->send[me] = send;
  g->bytes[me] = bytes;
  cudaError_t e = cudaEventRecord(g->ready[me], stream);
  if (e != cudaSuccess) {
    dpsVirtualGroupAbort(g);
    return dpsSetError(dpsCudaError, "virtual collective: cudaEventRecord: %s",
                       cudaGetErrorString(e));
  }
  DPS_CHECK(barrierOr(g, "collective"));
  for (int src = 0; src < g->tp && e == cudaSuccess; ++src) {
    if (g->bytes[src] != bytes) {
      dpsVirtualGroupAbort(g);
      return dpsSetError(dpsInvalidUsage, "virtual collective: rank %d sends %zu bytes, rank %d %zu",
                         src, g->bytes[src], me, bytes);
    }
    if (src == skip) continue;
    e = cudaStreamWaitEvent(stream, g->ready[src], 0);
    const char* from = (const char*)g->send[src] + (a2a ? (size_t)me * bytes : 0);
    if (e == cudaSuccess && bytes)
      e = cudaMemcpyAsync((char*)recv + (size_t)src * bytes, from, bytes,
                          cudaMemcpyDeviceToDevice, stream);
  }
  if (e == cudaSuccess) e = cudaEventRecord(g->done[me], stream);
  if (e != cudaSuccess) {
    dpsVirtualGroupAbort(g);
    return dpsSetError(dpsCudaError, "virtual collective copies: %s", cudaGetErrorString(e));
  }
  DPS_CHECK(barrierOr(g, "collective"));
  for (int q = 0; q < g->tp && e == cudaSuccess; ++q)
    if (q != me) e = cudaStreamWaitEvent(stream, g->done[q], 0);
  if (e != cudaSuccess) /* every rank is past the last meeting */
    return dpsSetError(dpsCudaError, "virtual collective wait: %s", cudaGetErrorString(e));
  return dpsSuccess;
}

static dpsResult_t vgAllGather(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                               cudaStream_t stream) {
  return vgCopy(comm, send, recv, bytes, 0, -1, stream);
}

static dpsResult_t vgAllToAll(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                              int skip_rank, cudaStream_t stream) {
  return vgCopy(comm, send, recv, bytes, 1, skip_rank, stream);
}

static const dpsProvider kVirtualProvider = {
    .name = "virtual ranks (tests)",
    .device = &dpsCudaDeviceHooks,
    .onesided_reachable = vgReachable,
    .exchange = vgExchange,
    .async_error = NULL,
    .finish = vgFinish,
    .sym_alloc = vgSymAlloc,
    .sym_register = vgSymRegister,
    .sym_deregister = vgSymDeregister,
    .sym_free = vgSymFree,
    .all_gather = vgAllGather,
    .all_to_all = vgAllToAll,
};

dpsResult_t dpsVirtualGroupCreate(dpsVirtualGroup** out, int tp, int barrier_s) {
  if (out == NULL || tp < 1 || tp > VG_MAX_RANKS)
    return dpsSetError(dpsInvalidArgument, "dpsVirtualGroupCreate: tp=%d (1..%d)", tp,
                       VG_MAX_RANKS);
  dpsVirtualGroup* g = (dpsVirtualGroup*)calloc(1, sizeof *g);
  if (g == NULL) return dpsSetError(dpsSystemError, "out of host memory");
  g->tp = tp;
  g->barrier_s = barrier_s > 0 ? barrier_s : 120;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  for (int q = 0; q < tp; ++q) {
    if (cudaEventCreateWithFlags(&g->ready[q], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->done[q], cudaEventDisableTiming) != cudaSuccess) {
      dpsVirtualGroupDestroy(g);
      return dpsSetError(dpsCudaError, "dpsVirtualGroupCreate: cudaEventCreate failed");
    }
  }
  *out = g;
  return dpsSuccess;
}

void dpsVirtualGroupDestroy(dpsVirtualGroup* g) {
  if (g == NULL) return;
  if (g->nkept > 0) {
    /* every rank's work, a peer's late store included, has finished */
    (void)cudaDeviceSynchronize();
    for (int i = 0; i < g->nkept; ++i) (void)cudaFreeAsync(g->kept[i], NULL);
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
  }
  for (int q = 0; q < g->tp; ++q) {
    if (g->ready[q]) cudaEventDestroy(g->ready[q]);
    if (g->done[q]) cudaEventDestroy(g->done[q]);
  }
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g);
}

dpsResult_t dpsCommInitVirtual(dpsComm_t* comm, dpsVirtualGroup* g, const dpsConfig_t* config) {
  if (comm == NULL || g == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsCommInitVirtual: %s is NULL", comm ? "group" : "comm");
  DPS_CHECK(dpsConfigCheck(config));
  if (config->tp_size != g->tp)
    return dpsSetError(dpsInvalidArgument, "dpsCommInitVirtual: tp_size=%d, the group has %d ranks",
                       config->tp_size, g->tp);
  int device = config->cuda_device;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess)
    return dpsSetError(dpsCudaError, "dpsCommInitVirtual: no current device");
  dpsDeviceGuard guard;
  DPS_CHECK(dpsDeviceEnter(&guard, device));
  dpsResult_t r = dpsCommCreate(comm, config, device, &kVirtualProvider, g, NULL, 0, NULL);
  if (r != dpsSuccess) dpsVirtualGroupAbort(g); /* peers waiting in a later step fail too */
  dpsDeviceLeave(&guard);
  return r;
}
