/* dps-perf operation: dpsTopK with k = 64 (DP_TOPK_K). Each rank reads its
 * [rows, V/tp] shard and exchanges k (value, index) pairs per row; bytes =
 * the shard's bytes, the efficiency is against the HBM read peak. Shapes as
 * argmax. */
#include "select_case.h"

static int setup(const DpCase* c, const DpHost* h, DpBufs* b, DpLocal* l) {
  return dpSelSetup(c, h, b, l, DP_TOPK_K);
}

const DpOp dpOpTopk = DP_SELECT_OP("topk", setup);
