#!/usr/bin/env bash
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
echo "build done at $((SECONDS-T0)) s"
for S in 8 7 5 3 1; do
  DPSAMPLING_SELECT_SPLIT=$S timeout 100 $B/tests/test_gpu_select > $OUT/select-$S.log 2>&1; echo "test_gpu_select split=$S rc=$? $(grep -c 'mismatch\|FAIL\|want' $OUT/select-$S.log) bad lines"
done
cat $OUT/select-8.log > $OUT/select.log; rm -f $OUT/select-[13578].log
timeout 120 $B/tests/test_gpu_virtual_ranks scenario=select > $OUT/vr-select.log 2>&1; echo "vr select rc=$?"; grep -E "total|FAIL" $OUT/vr-select.log | head -5
for S in 2 3 4 8; do
  echo "topk split<=$S: $(DPSAMPLING_SELECT_SPLIT=$S timeout 60 $B/tools/dps-perf -t 1 -b onesided -o topk -s 8x1x64640,64x1x76032 -r 20 2>&1 | grep -E '^ +topk ' | awk '{print $3"x"$5, $8}' | paste -sd' ')"
done
timeout 100 $B/tools/dps-perf -t 1 -b onesided -o argmax,argmax_lse,topk -r 20 > $OUT/perf-select.log 2>&1; echo "perf rc=$?"; grep -E "HBM|^ +(argmax|topk|argmax_lse) |PASSED|FAILED" $OUT/perf-select.log
timeout 100 $B/tools/dps-perf -t 1 -b nccl -o argmax,topk -r 20 > $OUT/perf-select-nccl.log 2>&1; echo "perf nccl rc=$?"; grep -E "^ +(argmax|topk) |PASSED|FAILED" $OUT/perf-select-nccl.log
echo "at $((SECONDS-T0)) s"
timeout 150 ctest --test-dir $B --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Failed|\(Failed\)" $OUT/ctest.log
PYTHONPATH=$B/python timeout 100 python3 -m pytest -q -rs python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?"; grep -E "passed|failed" $OUT/pytest.log | tail -2
echo "total $((SECONDS-T0)) s"
