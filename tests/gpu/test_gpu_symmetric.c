/* Symmetric memory on or off (tp = 1, one GPU): what creation does with the
 * NCCL the process runs, under the environment ctest gives it
 * (tests/CMakeLists.txt runs it three times: unchanged, NCCL_CUMEM_ENABLE=0,
 * NCCL_WIN_ENABLE=0).
 *  - symmetric memory off (either variable at 0, or NCCL before 2.28.7,
 *    whose single-rank communicators have no symmetric support: its
 *    transport.cc): backend=auto creates an nccl communicator;
 *    backend=onesided fails with dpsUnavailable and a message naming the
 *    cause; no communicator is returned;
 *  - on: auto and onesided both create onesided communicators;
 *  - every communicator created runs a swap and both gathers, each value
 *    checked against the fixtures' host reference;
 *  - dpsOnesidedAvailableOnDevices says 0 under either variable at 0, 1
 *    when symmetric memory is on;
 *  - afterwards the CUDA context still works (an illegal address touched by
 *    a setup kernel would fail every later call): allocate, set, copy back,
 *    compare, synchronize. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

/* Why symmetric memory is off here (the text the error must hold), or NULL. */
static const char* offBy(int nranks) {
  static const char* vars[] = {"NCCL_CUMEM_ENABLE=0", "NCCL_WIN_ENABLE=0"};
  for (int i = 0; i < 2; ++i) {
    const char* v = getenv(i == 0 ? "NCCL_CUMEM_ENABLE" : "NCCL_WIN_ENABLE");
    if (v != NULL && strcmp(v, "0") == 0) return vars[i];
  }
  int version = 0;
  if (nranks == 1 && ncclGetVersion(&version) == ncclSuccess && version < 22807)
    return "without a symmetric window";
  return NULL;
}

static int runOps(dpsComm_t comm, const dpsConfig_t* c) {
  gtBufs b;
  if (gtAllocBufs(&b, 1, c->max_pad_bs, c->num_tokens_per_req, c->vocab_size, c->logits_dtype, 0))
    return 1;
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int pads[3] = {c->max_pad_bs, 1, 3};
  for (int i = 0; i < 3; ++i) {
    void* out = NULL;
    if (gtSwapChecked(comm, &b, 0, 1, pads[i], 40 + i, s, &out)) return 1;
    if (gtGatherChecked(comm, &b, 0, 1, pads[i], 40 + i, s, NULL, NULL)) return 1;
  }
  GT_CUDA(cudaStreamDestroy(s));
  gtFreeBufs(&b);
  return 0;
}

static int cudaStillWorks(void) {
  int* d = NULL;
  int h[256];
  GT_CUDA(cudaMalloc((void**)&d, sizeof h));
  GT_CUDA(cudaMemset(d, 0x5a, sizeof h));
  GT_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaDeviceSynchronize());
  GT_CUDA(cudaFree(d));
  for (int i = 0; i < 256; ++i) FX_CHECK(h[i] == 0x5a5a5a5a, "device memory reads back %#x", h[i]);
  return 0;
}

static int body(int rank, int nranks, void* arg) {
  (void)arg;
  const char* off = offBy(nranks);
  struct ncclComm* nc = fxNcclComm();
  FX_CHECK(nc != NULL, "fxNcclComm failed");
  /* the quick check says what creation will find where the environment
   * decides (an old NCCL it cannot see) */
  int dev = 0, avail = -1;
  GT_CUDA(cudaGetDevice(&dev));
  FX_CHECK_OK(dpsOnesidedAvailableOnDevices(&dev, 1, &avail));
  if (off != NULL && strncmp(off, "NCCL_", 5) == 0)
    FX_CHECK(avail == 0, "dpsOnesidedAvailableOnDevices says %d with %s", avail, off);
  if (off == NULL)
    FX_CHECK(avail == 1, "dpsOnesidedAvailableOnDevices says %d, symmetric memory is on", avail);
  const dpsBackend_t asked[3] = {dpsBackendAuto, dpsBackendOnesided, dpsBackendNccl};
  for (int i = 0; i < 3; ++i) {
    dpsConfig_t c = gtConfig(rank, nranks, 8, 2, 1000, dpsBfloat16, asked[i]);
    dpsComm_t comm = (dpsComm_t)0x1;
    const dpsResult_t r = dpsCommInitFromNccl(&comm, nc, &c);
    const char* what = dpsBackendName(asked[i]);
    if (off != NULL && asked[i] == dpsBackendOnesided) {
      FX_CHECK(r == dpsUnavailable, "backend=onesided (%s): %s (%s), want dpsUnavailable", off,
               dpsGetErrorString(r), dpsGetLastError());
      FX_CHECK(strstr(dpsGetLastError(), off) != NULL, "the message does not say '%s': %s", off,
               dpsGetLastError());
      FX_CHECK(comm == (dpsComm_t)0x1, "a failed creation wrote *comm");
      printf("  backend=onesided: dpsUnavailable: %s\n", dpsGetLastError());
    } else {
      FX_CHECK(r == dpsSuccess, "backend=%s%s%s: %s (%s)", what, off ? ", symmetric memory off: " : "",
               off ? off : "", dpsGetErrorString(r), dpsGetLastError());
      dpsCommInfo_t info;
      FX_CHECK_OK(dpsCommGetInfo(comm, &info));
      const dpsBackend_t want = asked[i] != dpsBackendAuto ? asked[i]
                                : off != NULL             ? dpsBackendNccl
                                                          : dpsBackendOnesided;
      FX_CHECK(info.backend == want, "backend=%s resolved to %s, want %s (%s)", what,
               dpsBackendName(info.backend), dpsBackendName(want),
               off ? "symmetric memory is off" : "symmetric memory is on");
      printf("  backend=%s -> %s\n", what, dpsBackendName(info.backend));
      if (runOps(comm, &c)) return 1;
      FX_CHECK_OK(dpsCommDestroy(comm));
    }
    if (cudaStillWorks()) return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  dpsBackend_t backends[GT_MAX_BACKENDS];
  int nb = 0, ngpu = 0;
  const int start = gtStart("test_gpu_symmetric", 1, argc, argv, backends, &nb, &ngpu);
  if (start != 0) return start;
  const char* off = offBy(1);
  int version = 0;
  (void)ncclGetVersion(&version);
  printf("test_gpu_symmetric: symmetric memory %s%s%s, NCCL %d (built with %d.%d.%d)\n",
         off ? "off (" : "on", off ? off : "", off ? ")" : "", version, NCCL_MAJOR, NCCL_MINOR,
         NCCL_PATCH);
  const int rc = fxRunRanks(1, body, NULL, 300);
  printf("test_gpu_symmetric: %s\n", rc == 0 ? "PASS" : "FAIL");
  return rc == 0 ? 0 : 1;
}
