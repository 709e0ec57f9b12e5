#!/usr/bin/env bash
# Session 38, call 4: main's kernels as they are (9f929b9, with a59de8c's decide, never run) through
# the sampling tests. Carry build-carry/s38/tests4.tar.xz (local, ignored): test_gpu_sample,
# test_gpu_virtual_ranks, test_gpu_verify of 9f929b9 built on the CPU machine (cmake
# -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDPS_BUILD_PYTHON=OFF -DDPS_WERROR=ON;
# the library linked in statically).
source "$(dirname "$0")/../device_env.sh"
C=/tmp/c38; rm -rf $C; mkdir -p $C; tar -xJf build-carry/s38/tests4.tar.xz -C $C; B=$C/main4
t "test_gpu_sample"; $B/test_gpu_sample > $OUT/sample.log 2>&1; echo "rc=$?"
grep -E "passed \(|PASS|FAIL|wrong" $OUT/sample.log | head -12 | cut -c1-200
t "test_gpu_virtual_ranks (all)"; timeout 200 $B/test_gpu_virtual_ranks > $OUT/vr.log 2>&1; echo "rc=$?"
grep -E "total|FAIL" $OUT/vr.log | head -6
t "test_gpu_verify all"; $B/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -1 $OUT/verify.log
if [ $((SECONDS-T0)) -lt ${DEADLINE:-150} ]; then
  t "test_gpu_sample, exact_local"; DPSAMPLING_EXACT_SPLIT=0 DPS_SAMPLE_CHI2_SCALE=0.3 $B/test_gpu_sample > $OUT/sample_el.log 2>&1
  echo "rc=$?"; grep -E "PASS|FAIL" $OUT/sample_el.log | tail -3 | cut -c1-200
fi
t end
