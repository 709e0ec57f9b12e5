/* dps_example: one swap_batch_vocab and both verify gathers between ranks
 * that are processes on one node, one GPU each, with results checked.
 *
 *   dps_example [NRANKS]      (default 2; 1 runs on a one-GPU machine)
 *
 * The parent forks NRANKS children before anything touches CUDA (a CUDA
 * context does not survive fork). Child 0 makes the dpsUniqueId and writes it
 * into one pipe per other rank; every child then creates its communicator on
 * GPU <rank>, runs the three operations on its own stream and compares the
 * outputs with the values it expects. Exit status: 0 when every rank saw the
 * expected values; 1 on a mismatch or an error; 2 for a bad argument or when
 * fewer GPUs than ranks are visible.
 *
 * Build against an installed dpsampling:
 *   cc dps_example.c $(pkg-config --cflags --libs dpsampling) -o dps_example
 *   cc dps_example.c $(pkg-config --static --cflags --libs dpsampling_static) -o dps_example
 * or with CMake: find_package(dpsampling) and link dpsampling::dpsampling
 * (or dpsampling::dpsampling_static); see examples/c/CMakeLists.txt. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "dpsampling.h"

#define MAX_RANKS 64
#define REQS_PER_RANK 4 /* pad_bs = REQS_PER_RANK * nranks */
#define N_TOKENS 2      /* tokens per request (speculative verify) */
#define VOCAB_PER_RANK 96

/* The whole batch's logits: row = request*N + position, column = vocab id.
 * Small integers: exact in fp32. */
static float logit(int row, int col) { return (float)(row * 1000 + col); }

static int failf(int rank, const char* what, dpsResult_t r) {
  fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, what, dpsGetErrorString(r),
          dpsGetLastError());
  return 1;
}

#define DPS(rank, call)                               \
  do {                                                \
    dpsResult_t r_ = (call);                          \
    if (r_ != dpsSuccess) return failf(rank, #call, r_); \
  } while (0)

#define CUDA(rank, call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, cudaGetErrorString(e_));    \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

static int writeAll(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

static int readAll(int fd, void* p, size_t n) {
  char* c = (char*)p;
  while (n > 0) {
    ssize_t k = read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1; /* EOF: rank 0 gave up */
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The three operations on this rank; 0 when every value is as expected. */
static int runRank(int rank, int nranks, int (*pipes)[2]) {
  /* Fewer GPUs than ranks: every rank sees the same count and stops. (An
   * error here, e.g. no driver, is left to dpsCommInitRank to report.) */
  int ngpus = 0;
  if (cudaGetDeviceCount(&ngpus) == cudaSuccess && ngpus < nranks) {
    if (rank == 0)
      fprintf(stderr,
              "dps_example: %d ranks need %d GPUs (one each) but %d %s visible; run "
              "`dps_example %d` here\n",
              nranks, nranks, ngpus, ngpus == 1 ? "is" : "are", ngpus > 0 ? ngpus : 1);
    return 2;
  }

  dpsUniqueId id;
  if (rank == 0) {
    DPS(rank, dpsGetUniqueId(&id));
    for (int r = 1; r < nranks; ++r)
      if (writeAll(pipes[r][1], &id, sizeof id) != 0) {
        fprintf(stderr, "rank 0: sending the unique id to rank %d failed\n", r);
        return 1;
      }
  } else if (readAll(pipes[rank][0], &id, sizeof id) != 0) {
    fprintf(stderr, "rank %d: no unique id from rank 0 (it stopped before sending it)\n", rank);
    return 1;
  }

  const int pad_bs = REQS_PER_RANK * nranks, reqs = REQS_PER_RANK, n = N_TOKENS;
  const int64_t vocab = (int64_t)VOCAB_PER_RANK * nranks, cols = VOCAB_PER_RANK;
  dpsConfig_t cfg = DPS_CONFIG_INITIALIZER;
  cfg.tp_size = nranks;
  cfg.rank = rank;
  cfg.max_pad_bs = pad_bs;
  cfg.num_tokens_per_req = n;
  cfg.vocab_size = vocab;
  cfg.logits_dtype = dpsFloat32;
  cfg.backend = dpsBackendAuto; /* onesided over NVLink when it can, else nccl */
  cfg.cuda_device = rank;
  dpsComm_t comm = NULL;
  DPS(rank, dpsCommInitRank(&comm, &id, &cfg));
  dpsCommInfo_t info;
  DPS(rank, dpsCommGetInfo(comm, &info));

  CUDA(rank, cudaSetDevice(rank));
  cudaStream_t stream;
  CUDA(rank, cudaStreamCreate(&stream));
  const size_t in_rows = (size_t)pad_bs * n, out_rows = (size_t)reqs * n;
  float* h_in = malloc(in_rows * cols * sizeof(float));
  float* h_swap = malloc(out_rows * vocab * sizeof(float));
  int32_t* h_small = malloc(3 * (size_t)reqs * n * sizeof(int32_t));
  int32_t* h_gathered = malloc(3 * (size_t)pad_bs * n * sizeof(int32_t));
  float* h_lp = malloc((size_t)reqs * n * sizeof(float));
  float* h_lp_all = malloc((size_t)pad_bs * n * sizeof(float));
  if (!h_in || !h_swap || !h_small || !h_gathered || !h_lp || !h_lp_all) {
    fprintf(stderr, "rank %d: out of host memory\n", rank);
    return 1;
  }

  /* ---- swap_batch_vocab: [pad_bs*N, V/tp] -> [pad_bs/tp*N, V] ---- */
  for (size_t row = 0; row < in_rows; ++row)
    for (int64_t c = 0; c < cols; ++c)
      h_in[row * cols + c] = logit((int)row, (int)(rank * cols + c));
  void* d_in = NULL;
  CUDA(rank, cudaMalloc(&d_in, in_rows * cols * sizeof(float)));
  CUDA(rank, cudaMemcpy(d_in, h_in, in_rows * cols * sizeof(float), cudaMemcpyHostToDevice));
  void* d_swap = NULL;
  DPS(rank, dpsSwapBatchVocab(comm, d_in, (int64_t)in_rows, cols, dpsFloat32, pad_bs, &d_swap,
                              stream));
  CUDA(rank, cudaMemcpyAsync(h_swap, d_swap, out_rows * vocab * sizeof(float),
                             cudaMemcpyDeviceToHost, stream));

  /* ---- gather_verify_outputs: 3 x int32 [reqs, N|1] -> [pad_bs, N|1] ---- */
  int32_t* h_p = h_small;
  int32_t* h_ai = h_small + reqs * n;
  int32_t* h_al = h_small + 2 * reqs * n;
  for (int q = 0; q < reqs; ++q) {
    const int g = rank * reqs + q; /* global request */
    for (int d = 0; d < n; ++d) {
      h_p[q * n + d] = 100000 + g * 10 + d;
      h_ai[q * n + d] = 200000 + g * 10 + d;
    }
    h_al[q] = 1 + g % n;
  }
  int32_t* d_small = NULL;
  CUDA(rank, cudaMalloc((void**)&d_small, 3 * (size_t)reqs * n * sizeof(int32_t)));
  CUDA(rank, cudaMemcpy(d_small, h_small, 3 * (size_t)reqs * n * sizeof(int32_t),
                        cudaMemcpyHostToDevice));
  int32_t *o_p = NULL, *o_ai = NULL, *o_al = NULL;
  DPS(rank, dpsGatherVerifyOutputs(comm, d_small, d_small + reqs * n, d_small + 2 * reqs * n,
                                   reqs, n, pad_bs, &o_p, &o_ai, &o_al, stream));
  int32_t* g_p = h_gathered;
  int32_t* g_ai = h_gathered + pad_bs * n;
  int32_t* g_al = h_gathered + 2 * pad_bs * n;
  const size_t pn = (size_t)pad_bs * n * sizeof(int32_t);
  CUDA(rank, cudaMemcpyAsync(g_p, o_p, pn, cudaMemcpyDeviceToHost, stream));
  CUDA(rank, cudaMemcpyAsync(g_ai, o_ai, pn, cudaMemcpyDeviceToHost, stream));
  CUDA(rank, cudaMemcpyAsync(g_al, o_al, (size_t)pad_bs * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, stream));

  /* ---- gather_verify_logprobs: fp32 [reqs, N] -> [pad_bs, N] ---- */
  for (int q = 0; q < reqs; ++q)
    for (int d = 0; d < n; ++d) h_lp[q * n + d] = -0.5f * (float)((rank * reqs + q) * n + d);
  float* d_lp = NULL;
  CUDA(rank, cudaMalloc((void**)&d_lp, (size_t)reqs * n * sizeof(float)));
  CUDA(rank, cudaMemcpy(d_lp, h_lp, (size_t)reqs * n * sizeof(float), cudaMemcpyHostToDevice));
  float* o_lp = NULL;
  DPS(rank, dpsGatherVerifyLogprobs(comm, d_lp, reqs, n, pad_bs, &o_lp, stream));
  CUDA(rank, cudaMemcpyAsync(h_lp_all, o_lp, (size_t)pad_bs * n * sizeof(float),
                             cudaMemcpyDeviceToHost, stream));
  CUDA(rank, cudaStreamSynchronize(stream));

  /* ---- check ---- */
  long bad = 0;
  for (int q = 0; q < reqs; ++q)
    for (int d = 0; d < n; ++d)
      for (int64_t v = 0; v < vocab; ++v) {
        const int grow = (rank * reqs + q) * n + d;
        const float want = logit(grow, (int)v), got = h_swap[((size_t)q * n + d) * vocab + v];
        if (got != want && bad++ < 5)
          fprintf(stderr, "rank %d: swap[%d][%lld] = %g, want %g\n", rank, q * n + d,
                  (long long)v, got, want);
      }
  for (int g = 0; g < pad_bs; ++g) {
    for (int d = 0; d < n; ++d) {
      if ((g_p[g * n + d] != 100000 + g * 10 + d || g_ai[g * n + d] != 200000 + g * 10 + d) &&
          bad++ < 5)
        fprintf(stderr, "rank %d: gathered predict/accept_index[%d][%d] = %d/%d\n", rank, g, d,
                g_p[g * n + d], g_ai[g * n + d]);
      if (h_lp_all[g * n + d] != -0.5f * (float)(g * n + d) && bad++ < 5)
        fprintf(stderr, "rank %d: gathered logprobs[%d][%d] = %g\n", rank, g, d,
                h_lp_all[g * n + d]);
    }
    if (g_al[g] != 1 + g % n && bad++ < 5)
      fprintf(stderr, "rank %d: gathered accept_length[%d] = %d, want %d\n", rank, g, g_al[g],
              1 + g % n);
  }

  cudaFree(d_in);
  cudaFree(d_small);
  cudaFree(d_lp);
  cudaStreamDestroy(stream);
  DPS(rank, dpsCommDestroy(comm));
  free(h_in);
  free(h_swap);
  free(h_small);
  free(h_gathered);
  free(h_lp);
  free(h_lp_all);
  if (bad) {
    fprintf(stderr, "rank %d: %ld values differ from the expected ones\n", rank, bad);
    return 1;
  }
  printf("rank %d/%d (GPU %d, backend %s): swap_batch_vocab, gather_verify_outputs and "
         "gather_verify_logprobs gave the expected values\n",
         rank, nranks, rank, dpsBackendName(info.backend));
  fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  int nranks = 2;
  if (argc > 2 || (argc == 2 && (sscanf(argv[1], "%d", &nranks) != 1 || nranks < 1 ||
                                 nranks > MAX_RANKS))) {
    fprintf(stderr, "usage: %s [NRANKS]   (1..%d ranks, one GPU each; default 2)\n", argv[0],
            MAX_RANKS);
    return 2;
  }
  static int pipes[MAX_RANKS][2];
  for (int r = 1; r < nranks; ++r)
    if (pipe(pipes[r]) != 0) {
      perror("pipe");
      return 1;
    }
  pid_t pids[MAX_RANKS];
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      for (int k = 0; k < r; ++k) kill(pids[k], SIGTERM);
      return 1;
    }
    if (pids[r] == 0) {
      /* keep only this rank's ends: rank 0 writes every pipe, rank r reads its own */
      for (int k = 1; k < nranks; ++k) {
        if (r != 0) close(pipes[k][1]);
        if (k != r) close(pipes[k][0]);
      }
      fflush(stdout);
      _exit(runRank(r, nranks, pipes));
    }
  }
  for (int r = 1; r < nranks; ++r) {
    close(pipes[r][0]);
    close(pipes[r][1]);
  }
  /* A rank that fails may leave the others waiting in a collective: stop them. */
  int status = 0, left = nranks;
  while (left > 0) {
    int ws = 0;
    pid_t p = wait(&ws);
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    --left;
    for (int r = 0; r < nranks; ++r)
      if (pids[r] == p) pids[r] = 0; /* reaped: never signal it */
    const int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
    if (code != 0 && status == 0) {
      status = code;
      for (int r = 0; r < nranks; ++r)
        if (pids[r] > 0) kill(pids[r], SIGTERM);
    }
  }
  if (status == 0)
    printf("dps_example: %d rank%s passed\n", nranks, nranks == 1 ? "" : "s");
  else
    fprintf(stderr, "dps_example: FAILED (exit status %d)\n", status);
  return status;
}
