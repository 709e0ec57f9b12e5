/* Status names and the per-thread last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char g_last_error[1024];

dpsResult_t dpsSetError(dpsResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
  va_end(ap);
  if (dpsLogLevel() >= DPS_LOG_WARN) dpsLog(DPS_LOG_WARN, "%s: %s", dpsGetErrorString(res), g_last_error);
  return res;
}

void dpsClearError(void) { g_last_error[0] = '\0'; }

const char* dpsGetLastError(void) { return g_last_error; }

const char* dpsGetErrorString(dpsResult_t result) {
  switch (result) {
    case dpsSuccess: return "dpsSuccess";
    case dpsInvalidArgument: return "dpsInvalidArgument";
    case dpsInvalidUsage: return "dpsInvalidUsage";
    case dpsUnavailable: return "dpsUnavailable";
    case dpsCudaError: return "dpsCudaError";
    case dpsNcclError: return "dpsNcclError";
    case dpsSystemError: return "dpsSystemError";
    case dpsTimeout: return "dpsTimeout";
    case dpsInternalError: return "dpsInternalError";
    default: return "dpsUnknownResult";
  }
}

dpsResult_t dpsGetVersion(int* version) {
  if (version == NULL) return dpsSetError(dpsInvalidArgument, "dpsGetVersion: version is NULL");
  *version = DPS_VERSION_CODE;
  return dpsSuccess;
}

#ifndef DPS_CUDA_ARCHITECTURES_STR
#define DPS_CUDA_ARCHITECTURES_STR "?"
#endif

void dpsDeviceCodeNote(char* buf, size_t size) {
  const cudaError_t before = cudaPeekAtLastError();
  int dev = -1, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    if (before == cudaSuccess) (void)cudaGetLastError(); /* ours: forget it */
    snprintf(buf, size, "this build has device code for CMAKE_CUDA_ARCHITECTURES=\"%s\"",
             DPS_CUDA_ARCHITECTURES_STR);
    return;
  }
  snprintf(buf, size,
           "CUDA device %d is sm_%d%d; this build has device code for "
           "CMAKE_CUDA_ARCHITECTURES=\"%s\" (\"NN\" = sm_NN and PTX, \"NN-real\" = sm_NN only): "
           "rebuild with %d%d in CMAKE_CUDA_ARCHITECTURES",
           dev, major, minor, DPS_CUDA_ARCHITECTURES_STR, major, minor);
}
