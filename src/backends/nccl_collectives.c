/* Default collectives of the nccl backend (over an ncclComm_t). Byte counts are
 * per rank; see dpsCollectives_t in dpsampling.h for the semantics. */
#include <stdint.h>

#include "internal.h"

dpsResult_t dpsNcclAllGather(ncclComm_t nccl, const void* sendbuf, void* recvbuf, size_t bytes,
                             cudaStream_t stream) {
  if (nccl == NULL)
    return dpsSetError(dpsInvalidArgument, "all_gather: no NCCL communicator (NULL)");
  if (bytes == 0) return dpsSuccess;
  DPS_NCCL_CHECK(ncclAllGather(sendbuf, recvbuf, bytes, ncclInt8, nccl, stream));
  return dpsSuccess;
}

dpsResult_t dpsNcclAllToAllSkip(ncclComm_t nccl, const void* sendbuf, void* recvbuf, size_t bytes,
                                int skip_rank, cudaStream_t stream) {
  int nranks = 0;
  if (nccl == NULL)
    return dpsSetError(dpsInvalidArgument, "all_to_all: no NCCL communicator (ctx=NULL)");
  if (bytes == 0) return dpsSuccess;
  DPS_NCCL_CHECK(ncclCommCount(nccl, &nranks));
  const char* s = (const char*)sendbuf;
  char* r = (char*)recvbuf;
  DPS_NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == skip_rank) continue;
    ncclResult_t e = ncclSend(s + (size_t)peer * bytes, bytes, ncclInt8, peer, nccl, stream);
    if (e == ncclSuccess)
      e = ncclRecv(r + (size_t)peer * bytes, bytes, ncclInt8, peer, nccl, stream);
    if (e != ncclSuccess) {
      (void)ncclGroupEnd();
      return dpsSetError(dpsNcclError, "all_to_all: ncclSend/ncclRecv with peer=%d failed: %s",
                         peer, ncclGetErrorString(e));
    }
  }
  DPS_NCCL_CHECK(ncclGroupEnd());
  return dpsSuccess;
}

/* The public entry points (dpsampling.h): the same two functions, with the
 * argument checks of the public API. */
static dpsResult_t checkBytesArgs(const char* fn, ncclComm_t nccl, const void* sendbuf,
                                  const void* recvbuf, size_t bytes) {
  if (nccl == NULL) return dpsSetError(dpsInvalidArgument, "%s: nccl_comm is NULL", fn);
  if (bytes > 0 && (sendbuf == NULL || recvbuf == NULL))
    return dpsSetError(dpsInvalidArgument, "%s: %s is NULL with bytes=%zu", fn,
                       sendbuf == NULL ? "sendbuf" : "recvbuf", bytes);
  return dpsSuccess;
}

dpsResult_t dpsNcclAllGatherBytes(ncclComm_t nccl_comm, const void* sendbuf, void* recvbuf,
                                  size_t bytes, cudaStream_t stream) {
  DPS_CHECK(checkBytesArgs("dpsNcclAllGatherBytes", nccl_comm, sendbuf, recvbuf, bytes));
  return dpsNcclAllGather(nccl_comm, sendbuf, recvbuf, bytes, stream);
}

dpsResult_t dpsNcclAllToAllBytes(ncclComm_t nccl_comm, const void* sendbuf, void* recvbuf,
                                 size_t bytes, cudaStream_t stream) {
  DPS_CHECK(checkBytesArgs("dpsNcclAllToAllBytes", nccl_comm, sendbuf, recvbuf, bytes));
  return dpsNcclAllToAllSkip(nccl_comm, sendbuf, recvbuf, bytes, -1, stream);
}
