/* Default collectives of the nccl backend (ctx = ncclComm_t). Byte counts are
 * per rank; see dpsCollectives_t in dpsampling.h for the semantics. */
#include <stdint.h>

#include "internal.h"

dpsResult_t dpsNcclAllGather(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                             cudaStream_t stream) {
  ncclComm_t nccl = (ncclComm_t)ctx;
  if (nccl == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsNcclAllGather: ctx=NULL (no NCCL communicator)");
  if (bytes == 0) return dpsSuccess;
  DPS_NCCL_CHECK(ncclAllGather(sendbuf, recvbuf, bytes, ncclInt8, nccl, stream));
  return dpsSuccess;
}

dpsResult_t dpsNcclAllToAll(void* ctx, const void* sendbuf, void* recvbuf, size_t bytes,
                            cudaStream_t stream) {
  ncclComm_t nccl = (ncclComm_t)ctx;
  int nranks = 0;
  if (nccl == NULL)
    return dpsSetError(dpsInvalidArgument, "dpsNcclAllToAll: ctx=NULL (no NCCL communicator)");
  if (bytes == 0) return dpsSuccess;
  DPS_NCCL_CHECK(ncclCommCount(nccl, &nranks));
  const char* s = (const char*)sendbuf;
  char* r = (char*)recvbuf;
  DPS_NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < nranks; ++peer) {
    ncclResult_t e = ncclSend(s + (size_t)peer * bytes, bytes, ncclInt8, peer, nccl, stream);
    if (e == ncclSuccess)
      e = ncclRecv(r + (size_t)peer * bytes, bytes, ncclInt8, peer, nccl, stream);
    if (e != ncclSuccess) {
      (void)ncclGroupEnd();
      return dpsSetError(dpsNcclError, "dpsNcclAllToAll: ncclSend/ncclRecv with peer=%d failed: %s",
                         peer, ncclGetErrorString(e));
    }
  }
  DPS_NCCL_CHECK(ncclGroupEnd());
  return dpsSuccess;
}
