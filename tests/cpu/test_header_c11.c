/* The public header is plain C11: this file is compiled with
 * -std=c11 -pedantic -Wall -Wextra -Werror and includes nothing else first
 * (no CUDA or NCCL headers). At run time it checks the initializer macro. */
#include "dpsampling.h"

#include <stdio.h>

int main(void) {
  dpsConfig_t c = DPS_CONFIG_INITIALIZER;
  int bad = 0;
  if (c.size != sizeof(dpsConfig_t) || c.magic != DPS_CONFIG_MAGIC) bad = 1;
  if (c.num_tokens_per_req != 1 || c.logits_dtype != dpsDtypeUnset) bad = 1;
  if (c.backend != dpsBackendAuto || c.cuda_device != -1 || c.timeout_ms != 0) bad = 1;
  /* With every field filled in, the initializer yields a valid config. */
  c.tp_size = 2;
  c.max_pad_bs = 8;
  c.vocab_size = 64;
  if (dpsConfigCheck(&c) != dpsSuccess) {
    fprintf(stderr, "dpsConfigCheck: %s\n", dpsGetLastError());
    bad = 1;
  }
  printf("test_header_c11: %s\n", bad ? "FAILED" : "passed");
  return bad;
}
