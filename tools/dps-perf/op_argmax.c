/* dps-perf operations: dpsArgmax, and argmax_lse with the logsumexp. Each
 * rank reads its [rows, V/tp] shard once and exchanges 16 bytes per row;
 * bytes = the shard's bytes, the efficiency is against the HBM read peak.
 * Shapes: the PxNxV items of -s (rows = P*N), default 8x64640 and
 * {64,256,1024}x76032. */
#include "select_case.h"

static int setup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  return dpSelSetup(c, h, b, l, 0);
}

static int setupLse(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  return dpSelSetup(c, h, b, l, -1);
}

const DpOp dpOpArgmax = DP_SELECT_OP("argmax", setup);
const DpOp dpOpArgmaxLse = DP_SELECT_OP("argmax_lse", setupLse);
