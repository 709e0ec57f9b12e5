/* Which calls break another stream's global-mode capture? (device probe, not shipped) */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static ncclComm_t nc;
static cudaStream_t cap, other;
static void* dbuf;
static int mode_relaxed;

typedef int (*probe_fn)(void);
#define E(x) ((int)(x))

static int p_event_query(void) { cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); cudaEventRecord(e, other); int r = E(cudaEventQuery(e)); return r; }
static int p_event_sync(void) { cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); cudaEventRecord(e, other); return E(cudaEventSynchronize(e)); }
static int p_event_destroy(void) { cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); return E(cudaEventDestroy(e)); }
static int p_stream_sync(void) { cudaMemsetAsync(dbuf, 1, 64, other); return E(cudaStreamSynchronize(other)); }
static int p_stream_query(void) { return E(cudaStreamQuery(other)); }
static int p_memcpy_async_pinned(void) { static void* h; if (!h) cudaHostAlloc(&h, 64, 0); int r = E(cudaMemcpyAsync(h, dbuf, 64, cudaMemcpyDeviceToHost, other)); if (!r) r = E(cudaStreamSynchronize(other)); return r; }
static int p_memcpy_sync(void) { char h[64]; return E(cudaMemcpy(h, dbuf, 64, cudaMemcpyDeviceToHost)); }
static int p_free(void) { void* p = NULL; cudaThreadExchangeStreamCaptureMode(&(enum cudaStreamCaptureMode){cudaStreamCaptureModeRelaxed}); cudaMalloc(&p, 1 << 20); enum cudaStreamCaptureMode m = cudaStreamCaptureModeGlobal; cudaThreadExchangeStreamCaptureMode(&m); return E(cudaFree(p)); }
static int p_malloc(void) { void* p = NULL; int r = E(cudaMalloc(&p, 1 << 20)); return r; }
static int p_free_host(void) { void* h = NULL; cudaHostAlloc(&h, 64, cudaHostAllocMapped); return E(cudaFreeHost(h)); }
static int p_free_async(void) { void* p = NULL; cudaMallocAsync(&p, 1 << 20, other); cudaStreamSynchronize(other); int r = E(cudaFreeAsync(p, other)); if (!r) r = E(cudaStreamSynchronize(other)); return r; }
static int p_ncclmemfree(void) { void* p = NULL; ncclMemAlloc(&p, 2 << 20); return E(ncclMemFree(p)); }
static int p_win_dereg(void) { void* p = NULL; ncclWindow_t w; ncclMemAlloc(&p, 2 << 20); ncclCommWindowRegister(nc, p, 2 << 20, &w, NCCL_WIN_COLL_SYMMETRIC); int r = E(ncclCommWindowDeregister(nc, w)); ncclMemFree(p); return r; }
static int p_device_sync(void) { return E(cudaDeviceSynchronize()); }
static int p_stream_destroy(void) { cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); return E(cudaStreamDestroy(s)); }
static int p_nccl_destroy(void) { ncclUniqueId id; ncclComm_t c; ncclGetUniqueId(&id); ncclCommInitRank(&c, 1, id, 0); return E(ncclCommDestroy(c)); }

struct { const char* name; probe_fn fn; } probes[] = {
  {"cudaEventQuery", p_event_query}, {"cudaEventSynchronize", p_event_sync},
  {"cudaEventDestroy", p_event_destroy}, {"cudaStreamSynchronize(other)", p_stream_sync},
  {"cudaStreamQuery(other)", p_stream_query}, {"cudaMemcpyAsync D2H pinned + sync", p_memcpy_async_pinned},
  {"cudaMemcpy sync", p_memcpy_sync}, {"cudaMalloc", p_malloc}, {"cudaFree", p_free},
  {"cudaFreeHost", p_free_host}, {"cudaFreeAsync(other)", p_free_async},
  {"ncclMemFree", p_ncclmemfree}, {"ncclCommWindowDeregister", p_win_dereg},
  {"cudaStreamDestroy", p_stream_destroy}, {"ncclCommDestroy(tp1, pre-made inside)", p_nccl_destroy},
  {"cudaDeviceSynchronize", p_device_sync},
};

struct arg { int i; int ret; };
static void* other_thread(void* a) {
  struct arg* x = a;
  if (mode_relaxed) { enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed; cudaThreadExchangeStreamCaptureMode(&m); }
  x->ret = probes[x->i].fn();
  return NULL;
}

int main(void) {
  ncclUniqueId id; ncclGetUniqueId(&id);
  if (ncclCommInitRank(&nc, 1, id, 0) != ncclSuccess) { printf("nccl init failed\n"); return 1; }
  cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
  cudaMalloc(&dbuf, 1 << 20);
  const int n = (int)(sizeof probes / sizeof probes[0]);
  for (int where = 0; where < 2; ++where)
    for (int relaxed = 0; relaxed < 2; ++relaxed)
      for (int i = 0; i < n; ++i) {
        mode_relaxed = relaxed;
        cudaDeviceSynchronize(); cudaGetLastError();
        cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal);
        cudaMemsetAsync(dbuf, 0, 64, cap);
        int ret;
        if (where == 0) {
          enum cudaStreamCaptureMode m = relaxed ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeGlobal;
          cudaThreadExchangeStreamCaptureMode(&m);
          ret = probes[i].fn();
          cudaThreadExchangeStreamCaptureMode(&m);
        } else {
          struct arg a = {i, 0}; pthread_t t; pthread_create(&t, NULL, other_thread, &a); pthread_join(t, NULL); ret = a.ret;
        }
        cudaMemsetAsync(dbuf, 0, 64, cap);
        cudaGraph_t g = NULL;
        cudaError_t ee = cudaStreamEndCapture(cap, &g);
        cudaGraphExec_t ge = NULL;
        cudaError_t ie = ee == cudaSuccess ? cudaGraphInstantiate(&ge, g, 0) : ee;
        printf("%-14s %-8s %-40s call=%-4d (%s) capture=%s\n", where ? "other-thread" : "same-thread",
               relaxed ? "relaxed" : "global", probes[i].name, ret, cudaGetErrorName((cudaError_t)ret),
               ie == cudaSuccess ? "INTACT" : cudaGetErrorName(ie));
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
      }
  {
    cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    struct timespec t0, t1; cudaDeviceSynchronize();
    for (int k = 0; k < 3; ++k) {
      clock_gettime(CLOCK_MONOTONIC, &t0);
      for (int j = 0; j < 100000; ++j) cudaEventRecord(e, other);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      printf("cudaEventRecord host cost: %.3f us\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e5 / 1e3);
      clock_gettime(CLOCK_MONOTONIC, &t0);
      enum cudaStreamCaptureStatus st;
      for (int j = 0; j < 100000; ++j) cudaStreamIsCapturing(other, &st);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      printf("cudaStreamIsCapturing host cost: %.3f us\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e5 / 1e3);
      unsigned long long cid;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      for (int j = 0; j < 100000; ++j) cudaStreamGetCaptureInfo(other, &st, &cid, NULL, NULL, NULL, NULL);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      printf("cudaStreamGetCaptureInfo host cost: %.3f us\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e5 / 1e3);
    }
  }
  return 0;
}
