/* The CPU tests' provider: a group whose peers always agree, no device. */
#include <string.h>

#include "testsupport.h"

static int hostReachable(dpsComm_t comm) {
  (void)comm;
  return 1;
}

/* Every peer says what this rank says. */
static dpsResult_t hostExchange(dpsComm_t comm, const int64_t* mine, int64_t* all, int count) {
  for (int r = 0; r < comm->config.tp_size; ++r)
    memcpy(all + (size_t)r * (size_t)count, mine, sizeof(int64_t) * (size_t)count);
  return dpsSuccess;
}

static void hostFinish(dpsComm_t comm, int failed) {
  (void)comm;
  (void)failed;
}

static dpsResult_t hostNoSym(dpsComm_t comm, dpsSymMem* m, size_t bytes, const char* what) {
  (void)comm, (void)m, (void)bytes;
  return dpsSetError(dpsUnavailable, "host provider: no symmetric memory for %s", what);
}
static dpsResult_t hostNoRegister(dpsComm_t comm, dpsSymMem* m, const char* what) {
  (void)comm, (void)m;
  return dpsSetError(dpsUnavailable, "host provider: no symmetric memory for %s", what);
}
static void hostSymNone(dpsComm_t comm, dpsSymMem* m) {
  (void)comm;
  (void)m;
}
static dpsResult_t hostNoGather(dpsComm_t comm, const void* s, void* r, size_t b, cudaStream_t st) {
  (void)comm, (void)s, (void)r, (void)b, (void)st;
  return dpsSetError(dpsInternalError, "host provider: no device collectives");
}
static dpsResult_t hostNoA2A(dpsComm_t comm, const void* s, void* r, size_t b, int skip,
                             cudaStream_t st) {
  (void)comm, (void)s, (void)r, (void)b, (void)skip, (void)st;
  return dpsSetError(dpsInternalError, "host provider: no device collectives");
}

/* No device: nothing to create, enter or inspect (no aux stream, so
 * teardown has no work to wait for). */
static dpsResult_t hostDeviceInit(dpsComm_t comm) {
  (void)comm;
  return dpsSuccess;
}
static dpsResult_t hostEnter(dpsComm_t comm, dpsDeviceGuard* g) {
  (void)comm;
  g->switched = 0;
  return dpsSuccess;
}
static dpsResult_t hostInspect(dpsComm_t comm, const char* op, cudaStream_t stream, int* capturing,
                               unsigned long long* capture_id) {
  (void)comm, (void)op, (void)stream;
  *capturing = 0;
  *capture_id = 0;
  return dpsSuccess;
}

static const dpsDeviceHooks kHostDevice = {
    .init = hostDeviceInit, .enter = hostEnter, .inspect_stream = hostInspect};

static const dpsProvider kHostProvider = {
    .name = "host (CPU tests)",
    .device = &kHostDevice,
    .onesided_reachable = hostReachable,
    .exchange = hostExchange,
    .async_error = NULL,
    .finish = hostFinish,
    .sym_alloc = hostNoSym,
    .sym_register = hostNoRegister,
    .sym_deregister = hostSymNone,
    .sym_free = hostSymNone,
    .all_gather = hostNoGather,
    .all_to_all = hostNoA2A,
};

dpsResult_t dpsTestCommCreateHost(dpsComm_t* out, const dpsConfig_t* config, dpsBackend_t backend,
                                  const dpsBackendOps* ops) {
  if (out == NULL || ops == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsTestCommCreateHost: %s is NULL",
                       out ? "ops" : "comm");
  DPS_CHECK(dpsConfigCheck(config));
  dpsConfig_t c = *config;
  c.backend = backend;
  const int device = config->cuda_device < 0 ? 0 : config->cuda_device;
  DPS_CHECK(dpsCommCreate(out, &c, device, &kHostProvider, NULL, NULL, 0, ops));
  (*out)->config.backend = config->backend; /* requested as given, resolved as `backend` */
  return dpsSuccess;
}
