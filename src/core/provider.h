/* The provider: where a communicator's group lives. Every communicator is
 * created through one path (core/comm.c dpsCommCreate) with a provider, and
 * the backends take from it everything that involves the other ranks:
 *
 *  - host exchanges at creation and close (an all-gather of a few int64),
 *  - symmetric memory for the onesided backend (allocate locally, register
 *    collectively, every rank's address of it),
 *  - the device collectives of the nccl backend (all-gather, all-to-all),
 *  - the group's health and its end (NCCL's asynchronous error, destroying
 *    or aborting a communicator the library owns).
 *
 * Production has one provider (backends/nccl_provider.c: NCCL windows and
 * NCCL collectives). The tests install others through the same creation
 * path (tests/support: virtual ranks on one GPU, cudaMalloc buffers shared
 * between threads and a host barrier; a host-only one for the CPU tests),
 * so the backends' code that ships is the code the tests run. The device
 * hooks (`device`) are the production ones for every provider that has a
 * GPU; only the CPU tests' provider replaces them. */
#ifndef DPS_CORE_PROVIDER_H_
#define DPS_CORE_PROVIDER_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dpsampling.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DPS_PROVIDER_MAX_RANKS 8 /* ranks with symmetric memory (onesided) */

/* One symmetric allocation: `base` (this rank's, zeroed, `size` bytes),
 * `peer[r]` rank r's address of it as seen from this rank (after register). */
typedef struct dpsSymMem {
  void* base;
  size_t size;
  void* handle; /* the provider's (NCCL: the window) */
  int registered;
  char* peer[DPS_PROVIDER_MAX_RANKS];
} dpsSymMem;

struct dpsOpCtx;
struct dpsDeviceGuard;
struct dpsBackendOps;
struct ncclComm;

/* How the core reaches the device for a communicator. */
typedef struct dpsDeviceHooks {
  /* Creation, before the backend's init: the communicator's own stream and
   * event (comm->aux, comm->work_done). */
  dpsResult_t (*init)(dpsComm_t comm);
  /* Makes comm->device current, remembering the caller's (g). */
  dpsResult_t (*enter)(dpsComm_t comm, struct dpsDeviceGuard* g);
  /* An operation's stream: its capture status and id; refuses a stream of
   * another device. */
  dpsResult_t (*inspect_stream)(dpsComm_t comm, const char* op, cudaStream_t stream,
                                int* capturing, unsigned long long* capture_id);
} dpsDeviceHooks;

/* The production device hooks (core/comm.c, core/teardown.c). */
extern const dpsDeviceHooks dpsCudaDeviceHooks;

typedef struct dpsProvider {
  const char* name;
  const dpsDeviceHooks* device;

  /* ---- the group ---- */
  /* Whether the onesided backend can reach every rank by load/store (a
   * local probe; the ranks agree on the resolved backend afterwards). */
  int (*onesided_reachable)(dpsComm_t comm);
  /* Blocking host all-gather: all[r * count + i] = rank r's mine[i]. Every
   * rank calls it at the same point. */
  dpsResult_t (*exchange)(dpsComm_t comm, const int64_t* mine, int64_t* all, int count);
  /* Non-blocking: the group's asynchronous error (message set), or success.
   * May be NULL. */
  dpsResult_t (*async_error)(dpsComm_t comm);
  /* The end of the group: `failed` = 0 on the collective close of a healthy
   * group (every rank calls it), 1 when nothing collective may be done. */
  void (*finish)(dpsComm_t comm, int failed);

  /* ---- symmetric memory (onesided) ---- */
  /* Local: `bytes` of zeroed device memory that can be registered.
   * dpsUnavailable when this rank can have no symmetric memory (the
   * message says why and what setting to change). */
  dpsResult_t (*sym_alloc)(dpsComm_t comm, dpsSymMem* m, size_t bytes, const char* what);
  /* Collective: registers m with the group and fills m->peer.
   * dpsUnavailable when what the group handed out is not symmetric memory
   * (then nothing is left registered here). */
  dpsResult_t (*sym_register)(dpsComm_t comm, dpsSymMem* m, const char* what);
  /* Collective: every rank deregisters the same allocations in the same order. */
  void (*sym_deregister)(dpsComm_t comm, dpsSymMem* m);
  /* Local, capture-safe (teardown): frees m (a registration left in place
   * is released with the group). */
  void (*sym_free)(dpsComm_t comm, dpsSymMem* m);

  /* ---- device collectives (nccl backend), bytes per rank ---- */
  dpsResult_t (*all_gather)(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                            cudaStream_t stream);
  /* Without the exchange with `skip_rank` (-1: none). */
  dpsResult_t (*all_to_all)(dpsComm_t comm, const void* send, void* recv, size_t bytes,
                            int skip_rank, cudaStream_t stream);
} dpsProvider;

/* The production provider (backends/nccl_provider.c): comm->nccl. */
extern const dpsProvider dpsNcclProvider;

/* The one creation path (core/comm.c). `ops` NULL: the backend the registry
 * resolves; else these ops (the CPU tests' recording backend). `owns_nccl`:
 * the communicator destroys comm->nccl (NCCL provider). */
dpsResult_t dpsCommCreate(dpsComm_t* out, const dpsConfig_t* config, int device,
                          const dpsProvider* provider, void* provider_ctx,
                          struct ncclComm* nccl, int owns_nccl, const struct dpsBackendOps* ops);

/* Creation's and prepare's agreements (core/agree.c), over
 * provider->exchange; every rank calls them at the same point. dpsAgree is
 * the one exchange: every rank's status of a local step (`local`) and
 * `count` words (`mine`; all[r * count + i] = rank r's, when all != NULL),
 * and the group's outcome of `step`: a rank that failed keeps its own
 * error; the others fail with dpsUnavailable when every failure was
 * dpsUnavailable, else dpsSystemError ("failed on another rank", naming
 * `step` and the rank), so that no rank goes on into a collective another
 * will not join. A rank whose step was dpsUnavailable while another failed
 * otherwise returns dpsSystemError too. At tp == 1 nothing is exchanged.
 * dpsAgreeStatus: the status alone. dpsAgreeMin: and the element-wise
 * minimum of vals over the ranks (on success). */
dpsResult_t dpsAgree(dpsComm_t comm, dpsResult_t local, const char* step, const int64_t* mine,
                     int count, int64_t* all);
dpsResult_t dpsAgreeStatus(dpsComm_t comm, dpsResult_t local, const char* step);
dpsResult_t dpsAgreeMin(dpsComm_t comm, dpsResult_t local, const char* step, int64_t* vals,
                        int count);

#ifdef __cplusplus
}
#endif

#endif /* DPS_CORE_PROVIDER_H_ */
