/* Public API without a communicator or a GPU: NULL communicators and NULL
 * out-parameters are rejected with a message naming the argument, nothing is
 * written on failure, error strings and versions, names, and
 * dpsOnesidedAvailableOnDevices on a machine that may have no GPU. */
#include <stdio.h>
#include <string.h>

#include "fixtures.h"

int main(void) {
  /* ---- error strings ---- */
  static const char* names[dpsNumResults] = {
      "dpsSuccess",  "dpsInvalidArgument", "dpsInvalidUsage", "dpsUnavailable",  "dpsCudaError",
      "dpsNcclError", "dpsSystemError",    "dpsTimeout",      "dpsInternalError"};
  for (int i = 0; i < dpsNumResults; ++i) {
    const char* s = dpsGetErrorString((dpsResult_t)i);
    FX_CHECK(s != NULL && strcmp(s, names[i]) == 0, "dpsGetErrorString(%d) = %s, want %s", i,
             s ? s : "(null)", names[i]);
  }
  {
    const dpsResult_t out_of_range[] = {dpsNumResults, (dpsResult_t)-1, (dpsResult_t)1000};
    for (size_t i = 0; i < sizeof out_of_range / sizeof out_of_range[0]; ++i) {
      const char* s = dpsGetErrorString(out_of_range[i]);
      FX_CHECK(s != NULL && strcmp(s, "dpsUnknownResult") == 0, "dpsGetErrorString(%d) = %s",
               (int)out_of_range[i], s ? s : "(null)");
    }
  }
  /* before any failing call on this thread: the empty message, never NULL */
  FX_CHECK(dpsGetLastError() != NULL && dpsGetLastError()[0] == '\0', "dpsGetLastError = %s",
           dpsGetLastError() ? dpsGetLastError() : "(null)");

  /* ---- version: the file VERSION (read here at run time), the project's
   * version (CMakeLists.txt reads that file; passed in as
   * DPS_TEST_PROJECT_VERSION), the header and the library all agree ---- */
  {
    int major = -1, minor = -1, patch = -1;
    FX_CHECK(sscanf(DPS_TEST_PROJECT_VERSION, "%d.%d.%d", &major, &minor, &patch) == 3,
             "project version '%s'", DPS_TEST_PROJECT_VERSION);
    FILE* vf = fopen(DPS_TEST_VERSION_FILE, "r");
    FX_CHECK(vf != NULL, "cannot open %s", DPS_TEST_VERSION_FILE);
    int fmaj = -1, fmin = -1, fpat = -1;
    const int got = fscanf(vf, "%d.%d.%d", &fmaj, &fmin, &fpat);
    fclose(vf);
    FX_CHECK(got == 3 && fmaj == major && fmin == minor && fpat == patch,
             "%s says %d.%d.%d, the project %s", DPS_TEST_VERSION_FILE, fmaj, fmin, fpat,
             DPS_TEST_PROJECT_VERSION);
    FX_CHECK(DPS_VERSION_MAJOR == major && DPS_VERSION_MINOR == minor &&
                 DPS_VERSION_PATCH == patch,
             "header %d.%d.%d, project %s", DPS_VERSION_MAJOR, DPS_VERSION_MINOR,
             DPS_VERSION_PATCH, DPS_TEST_PROJECT_VERSION);
    int v = -1;
    FX_CHECK_OK(dpsGetVersion(&v));
    FX_CHECK(v == major * 10000 + minor * 100 + patch, "library version %d, project %s", v,
             DPS_TEST_PROJECT_VERSION);
    FX_CHECK(v == DPS_VERSION_CODE, "library version %d, header %d", v, DPS_VERSION_CODE);
    v = -1;
    FX_CHECK_ERR(dpsGetVersion(NULL), dpsInvalidArgument, "version");
  }

  /* ---- names ---- */
  FX_CHECK(strcmp(dpsBackendName(dpsBackendAuto), "auto") == 0, "auto");
  FX_CHECK(strcmp(dpsBackendName(dpsBackendNccl), "nccl") == 0, "nccl");
  FX_CHECK(strcmp(dpsBackendName(dpsBackendOnesided), "onesided") == 0, "onesided");
  FX_CHECK(strcmp(dpsBackendName((dpsBackend_t)17), "invalid") == 0, "backend 17: %s",
           dpsBackendName((dpsBackend_t)17));
  FX_CHECK(strcmp(dpsDataTypeName(dpsFloat32), "fp32") == 0, "fp32");
  FX_CHECK(strcmp(dpsDataTypeName(dpsBfloat16), "bf16") == 0, "bf16");
  FX_CHECK(strcmp(dpsDataTypeName(dpsFloat16), "fp16") == 0, "fp16");
  FX_CHECK(strcmp(dpsDataTypeName(dpsDtypeUnset), "unset") == 0, "unset");
  FX_CHECK(strcmp(dpsDataTypeName((dpsDataType_t)17), "invalid") == 0, "dtype 17: %s",
           dpsDataTypeName((dpsDataType_t)17));

  /* ---- operations on a NULL communicator: fail, name "comm", write nothing ---- */
  {
    int32_t dummy_i[4] = {0};
    float dummy_f[4] = {0};
    char dummy_logits[64];
    void* const sentinel = (void*)&dummy_logits[1];
    void* out = sentinel;
    int32_t *p = (int32_t*)sentinel, *ai = (int32_t*)sentinel, *al = (int32_t*)sentinel;
    float* lp = (float*)sentinel;

    FX_CHECK_ERR(dpsSwapBatchVocab(NULL, dummy_logits, 8, 32, dpsFloat32, 8, &out, NULL),
                 dpsInvalidArgument, "comm");
    FX_CHECK(out == sentinel, "swap wrote its output on failure");
    FX_CHECK_ERR(dpsGatherVerifyOutputs(NULL, dummy_i, dummy_i, dummy_i, 4, 1, 8, &p, &ai, &al,
                                        NULL),
                 dpsInvalidArgument, "comm");
    FX_CHECK(p == sentinel && ai == sentinel && al == sentinel, "gather wrote outputs");
    FX_CHECK_ERR(dpsGatherVerifyLogprobs(NULL, dummy_f, 4, 1, 8, &lp, NULL), dpsInvalidArgument,
                 "comm");
    FX_CHECK(lp == (float*)sentinel, "logprobs wrote output");
    FX_CHECK_ERR(dpsCommPrepare(NULL, dpsBfloat16), dpsInvalidArgument, "comm");
    FX_CHECK_ERR(dpsCommSetCollectives(NULL, NULL), dpsInvalidArgument, "comm");
    {
      dpsCommInfo_t info;
      memset(&info, 0x5a, sizeof info);
      FX_CHECK_ERR(dpsCommGetInfo(NULL, &info), dpsInvalidArgument, "comm");
      FX_CHECK(info.tp_size == 0x5a5a5a5a, "info written on failure");
    }
    {
      dpsResult_t ae = (dpsResult_t)-5;
      FX_CHECK_ERR(dpsCommGetAsyncError(NULL, &ae), dpsInvalidArgument, "comm");
      FX_CHECK(ae == (dpsResult_t)-5, "async_error written on failure");
    }
    {
      int mb = -5;
      FX_CHECK_ERR(dpsCommOpMayBlock(NULL, &mb), dpsInvalidArgument, "comm");
      FX_CHECK(mb == -5, "may_block written on failure");
    }
    /* The default collectives: NULL communicator or buffers, before any NCCL call. */
    {
      char b[8];
      FX_CHECK_ERR(dpsNcclAllGatherBytes(NULL, b, b, 8, NULL), dpsInvalidArgument, "nccl_comm");
      FX_CHECK_ERR(dpsNcclAllToAllBytes(NULL, b, b, 8, NULL), dpsInvalidArgument, "nccl_comm");
    }
    FX_CHECK_OK(dpsCommDestroy(NULL));
  }

  /* ---- bootstrap argument checks (fail before touching NCCL or the GPU) ---- */
  {
    dpsConfig_t c = DPS_CONFIG_INITIALIZER;
    c.tp_size = 2;
    c.rank = 0;
    c.max_pad_bs = 8;
    c.vocab_size = 64;
    dpsUniqueId id;
    memset(&id, 0, sizeof id);
    dpsComm_t comm = (dpsComm_t)&id; /* sentinel */
    FX_CHECK_ERR(dpsGetUniqueId(NULL), dpsInvalidArgument, "unique_id");
    FX_CHECK_ERR(dpsCommInitRank(NULL, &id, &c), dpsInvalidArgument, "comm");
    FX_CHECK_ERR(dpsCommInitRank(&comm, NULL, &c), dpsInvalidArgument, "unique_id");
    FX_CHECK(comm == (dpsComm_t)&id, "comm written on failure");
    FX_CHECK_ERR(dpsCommInitRank(&comm, &id, NULL), dpsInvalidArgument, "config");
    c.rank = 2;
    FX_CHECK_ERR(dpsCommInitRank(&comm, &id, &c), dpsInvalidArgument, "rank=2");
    FX_CHECK(comm == (dpsComm_t)&id, "comm written on failure");
    c.rank = 0;
    FX_CHECK_ERR(dpsCommInitFromNccl(&comm, NULL, &c), dpsInvalidArgument, "nccl_comm");
    FX_CHECK_ERR(dpsCommInitFromNccl(NULL, NULL, &c), dpsInvalidArgument, "comm");
    FX_CHECK(comm == (dpsComm_t)&id, "comm written on failure");
  }

  /* ---- name parsing ---- */
  {
    dpsBackend_t b;
    FX_CHECK_ERR(dpsParseBackend("bogus", &b), dpsInvalidArgument, "bogus");
  }

  /* ---- creation without a GPU: said plainly, naming the ordinal, no source path ---- */
  if (fxGpuCount() == 0) {
    dpsUniqueId id;
    memset(&id, 0, sizeof id);
    dpsConfig_t c = DPS_CONFIG_INITIALIZER;
    c.tp_size = 1;
    c.max_pad_bs = 8;
    c.vocab_size = 64;
    dpsComm_t comm = NULL;
    for (int dev = -1; dev <= 1; ++dev) {
      c.cuda_device = dev;
      char want[48];
      snprintf(want, sizeof want, "no usable CUDA device (cuda_device=%d", dev);
      FX_CHECK_ERR(dpsCommInitRank(&comm, &id, &c), dpsCudaError, want);
      FX_CHECK(comm == NULL, "comm written on failure");
      FX_CHECK(strstr(dpsGetLastError(), ".c:") == NULL && strchr(dpsGetLastError(), '/') == NULL,
               "source path in the message: %s", dpsGetLastError());
    }
    printf("creation without a GPU: %s\n", dpsGetLastError());
  }

  /* ---- dpsOnesidedAvailableOnDevices: graceful without a GPU ---- */
  {
    const int ngpu = fxGpuCount(); /* probed in a child: this process stays CUDA-free */
    int devs[2] = {0, 1};
    int avail = -1;
    FX_CHECK_ERR(dpsOnesidedAvailableOnDevices(devs, 2, NULL), dpsInvalidArgument, "available");
    avail = -1;
    dpsResult_t r = dpsOnesidedAvailableOnDevices(NULL, 0, &avail);
    FX_CHECK(r == dpsInvalidArgument, "NULL devices -> %s", dpsGetErrorString(r));
    FX_CHECK(avail == -1, "written on failure");
    avail = -1;
    r = dpsOnesidedAvailableOnDevices(devs, 2, &avail);
    if (ngpu == 0) {
      /* No GPU: not available, and no error (documented: writes 0). */
      FX_CHECK(r == dpsSuccess && avail == 0, "no GPU: result %s (%s) avail %d",
               dpsGetErrorString(r), dpsGetLastError(), avail);
    } else if (ngpu == 1) {
      FX_CHECK(r == dpsInvalidArgument && strstr(dpsGetLastError(), "cuda_devices[1]=1") != NULL,
               "device 1 of 1: %s: %s", dpsGetErrorString(r), dpsGetLastError());
      FX_CHECK(avail == -1, "written on failure");
    } else {
      /* the ground truth: CUDA's peer access both ways, probed in a child */
      const int want = fxPeerAccess(0, 1) == 1 && fxPeerAccess(1, 0) == 1;
      FX_CHECK_OK(r);
      FX_CHECK(avail == want, "available=%d, peer access 0<->1 says %d", avail, want);
      printf("dpsOnesidedAvailableOnDevices(0,1) = %d on %d GPUs\n", avail, ngpu);
    }
    if (ngpu >= 1) { /* one device: no pair to reach, so available */
      avail = -1;
      FX_CHECK_OK(dpsOnesidedAvailableOnDevices(devs, 1, &avail));
      FX_CHECK(avail == 1, "one device: available=%d", avail);
    }
  }

  printf("test_api_args: OK\n");
  return 0;
}
