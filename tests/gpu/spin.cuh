/* Holds the calling thread for `ns` nanoseconds of the global timer (the
 * test kernels that delay a stream: vr_spin.cu, early_writer.cu). */
#ifndef DPS_TEST_SPIN_CUH_
#define DPS_TEST_SPIN_CUH_

__device__ __forceinline__ void gtSpinNs(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

#endif /* DPS_TEST_SPIN_CUH_ */
