/* Teardown: the collective close, the deferred local release, and the
 * process-wide list of released communicators, drained at safe points.
 *
 * Why deferred: a Python tensor (DLPack) may alias a communicator's output
 * and die at any moment, e.g. while an engine captures a CUDA graph on some
 * stream in global mode. Freeing then (cudaFree, a device synchronize)
 * would invalidate that capture, so the last release only queues; the
 * frees happen at the next safe point, as PyTorch's caching allocator
 * defers frees requested during a capture.
 *
 * Why relaxed capture mode: even at a safe point another thread may be
 * capturing. Every teardown call here is one that, made in relaxed mode,
 * leaves such a capture intact (measured on H200 with CUDA 13 and NCCL
 * 2.28: cudaEventQuery/Synchronize, cudaStreamSynchronize of our own
 * stream, cudaMemcpy, cudaFreeAsync, cudaFreeHost, ncclMemFree,
 * ncclCommWindowDeregister, ncclCommDestroy, cudaStreamDestroy,
 * cudaEventDestroy; cudaFree and cudaDeviceSynchronize break it in any
 * mode), which is why device buffers come from cudaMallocAsync. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "provider.h"

void dpsRelaxEnter(dpsCaptureRelax* r) {
  r->prev = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&r->prev);
}

void dpsRelaxLeave(dpsCaptureRelax* r) {
  enum cudaStreamCaptureMode m = r->prev;
  (void)cudaThreadExchangeStreamCaptureMode(&m);
}

dpsResult_t dpsTeardownInit(dpsComm_t comm) {
  DPS_CUDA_CHECK(cudaStreamCreateWithFlags(&comm->aux, cudaStreamNonBlocking));
  DPS_CUDA_CHECK(cudaEventCreateWithFlags(&comm->work_done, cudaEventDisableTiming));
  return dpsSuccess;
}

dpsResult_t dpsDeviceAlloc(dpsComm_t comm, void** p, size_t bytes, const char* what) {
  *p = NULL;
  if (bytes < 16) bytes = 16;
  cudaError_t e = cudaMallocAsync(p, bytes, comm->aux);
  if (e == cudaSuccess) e = cudaMemsetAsync(*p, 0, bytes, comm->aux);
  if (e == cudaSuccess) e = cudaStreamSynchronize(comm->aux);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (*p != NULL) (void)cudaFreeAsync(*p, comm->aux);
    *p = NULL;
    return dpsSetError(e == cudaErrorMemoryAllocation ? dpsSystemError : dpsCudaError,
                       "allocating %zu bytes of device memory for %s failed: %s", bytes, what,
                       cudaGetErrorString(e));
  }
  return dpsSuccess;
}

void dpsDeviceFree(dpsComm_t comm, void** p) {
  if (*p == NULL) return;
  (void)cudaFreeAsync(*p, comm->aux);
  *p = NULL;
}

dpsResult_t dpsAllocVerifyOutputs(dpsComm_t comm) {
  const dpsVerifyOutLayout o =
      dpsVerifyOutputsLayout(comm->config.max_pad_bs, comm->config.num_tokens_per_req);
  DPS_CHECK(dpsDeviceAlloc(comm, &comm->verify_mem, o.bytes, "the verify outputs"));
  comm->vout = dpsVerifyOutputsAt(comm->verify_mem, comm->config.max_pad_bs,
                                  comm->config.num_tokens_per_req);
  return dpsSuccess;
}

void dpsFreeVerifyOutputs(dpsComm_t comm) {
  dpsDeviceFree(comm, &comm->verify_mem);
  memset(&comm->vout, 0, sizeof comm->vout);
}

void dpsNoteWork(dpsComm_t comm, cudaStream_t stream, int capturing, unsigned long long capture_id) {
  if (comm->work_done == NULL) return; /* no device (the CPU tests' provider) */
  int free_slot = -1;
  for (int i = 0; i < DPS_MAX_CAPTURES; ++i) {
    /* the stream's earlier capture has ended (it runs uncaptured work or a
     * new capture now): forget it */
    if (comm->captures[i].used && comm->captures[i].stream == stream) comm->captures[i].used = 0;
    if (!comm->captures[i].used && free_slot < 0) free_slot = i;
  }
  if (!capturing) {
    (void)cudaEventRecord(comm->work_done, stream);
    return;
  }
  if (free_slot < 0) free_slot = 0; /* more than DPS_MAX_CAPTURES at once: keep the newest */
  comm->captures[free_slot].stream = stream;
  comm->captures[free_slot].id = capture_id;
  comm->captures[free_slot].used = 1;
}

/* Whether a stream that captured our work still captures (refuse close). */
static dpsResult_t checkNotCaptured(dpsComm_t comm, const char* what) {
  for (int i = 0; i < DPS_MAX_CAPTURES; ++i) {
    if (!comm->captures[i].used) continue;
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaError_t e = dpsStreamCaptureInfo(comm->captures[i].stream, &st, &id);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* the stream is gone: its capture ended with it */
      comm->captures[i].used = 0;
      continue;
    }
    if (st != cudaStreamCaptureStatusNone && id == comm->captures[i].id)
      return dpsSetError(dpsInvalidUsage,
                         "%s: stream=%p is still capturing a CUDA graph (capture id %llu) that "
                         "contains operations of this communicator; end the capture first",
                         what, (void*)comm->captures[i].stream, id);
    comm->captures[i].used = 0;
  }
  return dpsSuccess;
}

int64_t dpsCloseWaitMs(int timeout_ms) { return 2 * (int64_t)timeout_ms + 1000; }

static long long nowMs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Waits for the communicator's own uncaptured work, at most `ms`. */
static int waitOwnWork(dpsComm_t comm, int64_t ms) {
  if (comm->work_done == NULL) return 1; /* nothing was ever enqueued */
  const long long deadline = nowMs() + ms;
  for (;;) {
    cudaError_t e = cudaEventQuery(comm->work_done);
    if (e == cudaSuccess) return 1;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return 0;
    }
    if (nowMs() > deadline) return 0;
    struct timespec nap = {0, 50 * 1000};
    nanosleep(&nap, NULL);
  }
}

/* ---- the process-wide list of released communicators --------------------- */
static pthread_mutex_t g_pending_lock = PTHREAD_MUTEX_INITIALIZER;
static dpsComm_t g_pending = NULL;

void dpsCommFreeNow(dpsComm_t comm) {
  if (comm->aux != NULL && comm->work_done != NULL)
    (void)cudaStreamWaitEvent(comm->aux, comm->work_done, 0);
  if (comm->ops && comm->ops->destroy) comm->ops->destroy(comm);
  /* Not closed (or closed without reaching this step): no collective now. */
  comm->prov->finish(comm, 1);
  if (comm->work_done) (void)cudaEventDestroy(comm->work_done);
  if (comm->aux) (void)cudaStreamDestroy(comm->aux); /* its queued frees still run */
  (void)cudaGetLastError();
  free(comm);
}

dpsResult_t dpsReleasePending(int* still_pending) {
  if (still_pending != NULL) *still_pending = 0;
  pthread_mutex_lock(&g_pending_lock);
  dpsComm_t list = g_pending;
  g_pending = NULL;
  pthread_mutex_unlock(&g_pending_lock);
  if (list == NULL) return dpsSuccess; /* no CUDA call when there is nothing to free */

  dpsCaptureRelax relax;
  dpsRelaxEnter(&relax);
  dpsComm_t keep = NULL;
  int kept = 0;
  while (list != NULL) {
    dpsComm_t c = list;
    list = c->next_pending;
    dpsDeviceGuard g;
    int entered = c->prov->device->enter(c, &g) == dpsSuccess;
    cudaError_t q = entered && c->work_done ? cudaEventQuery(c->work_done) : cudaSuccess;
    if (q == cudaErrorNotReady) {
      c->next_pending = keep;
      keep = c;
      ++kept;
    } else {
      (void)cudaGetLastError();
      dpsCommFreeNow(c);
    }
    if (entered) dpsDeviceLeave(&g);
  }
  dpsRelaxLeave(&relax);
  if (keep != NULL) {
    pthread_mutex_lock(&g_pending_lock);
    dpsComm_t tail = keep;
    while (tail->next_pending != NULL) tail = tail->next_pending;
    tail->next_pending = g_pending;
    g_pending = keep;
    pthread_mutex_unlock(&g_pending_lock);
  }
  if (still_pending != NULL) *still_pending = kept;
  return dpsSuccess;
}

dpsResult_t dpsCommRelease(dpsComm_t comm) {
  if (comm == NULL) return dpsSuccess;
  pthread_mutex_lock(&g_pending_lock);
  comm->next_pending = g_pending;
  g_pending = comm;
  pthread_mutex_unlock(&g_pending_lock);
  return dpsSuccess;
}

dpsResult_t dpsCommClose(dpsComm_t comm) {
  static const char* what = "dpsCommClose";
  if (comm == NULL) return dpsSetError(dpsInvalidArgument, "%s: comm is NULL", what);
  if (comm->closed) return dpsSuccess;
  dpsDeviceGuard g;
  DPS_CHECK(comm->prov->device->enter(comm, &g));
  dpsResult_t r = checkNotCaptured(comm, what);
  if (r != dpsSuccess) {
    dpsDeviceLeave(&g);
    return r;
  }
  dpsCaptureRelax relax;
  dpsRelaxEnter(&relax);
  /* The onesided kernels give up after one timeout each and the ones
   * queued behind a failure exit at once; NCCL's may wait forever for a
   * dead peer. */
  const int64_t wait_ms = dpsCloseWaitMs(comm->timeout_ms);
  if (!waitOwnWork(comm, wait_ms)) {
    dpsLog(DPS_LOG_WARN,
           "rank %d: dpsCommClose: the communicator's queued work did not finish within %" PRId64
           " ms; closing it as failed",
           comm->config.rank, wait_ms);
    (void)dpsCommMarkFailed(comm, dpsTimeout);
  }
  if (!atomic_load(&comm->sticky_error)) {
    dpsResult_t a = dpsCommAsyncError(comm);
    if (a != dpsSuccess) (void)dpsCommMarkFailed(comm, a);
  }
  int failed = atomic_load(&comm->sticky_error) != 0;
  if (comm->ops && comm->ops->close) failed = comm->ops->close(comm, failed);
  if (failed) (void)dpsCommMarkFailed(comm, dpsTimeout);
  comm->prov->finish(comm, failed);
  comm->closed = 1;
  (void)cudaGetLastError();
  dpsRelaxLeave(&relax);
  dpsDeviceLeave(&g);
  dpsClearError(); /* a failure found here is for dpsCommGetAsyncError, not this call */
  return dpsReleasePending(NULL);
}

dpsResult_t dpsCommDestroy(dpsComm_t comm) {
  if (comm == NULL) return dpsSuccess;
  DPS_CHECK(dpsCommClose(comm));
  DPS_CHECK(dpsCommRelease(comm));
  return dpsReleasePending(NULL);
}
