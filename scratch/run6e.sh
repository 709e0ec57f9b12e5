#!/usr/bin/env bash
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
echo "build done at $((SECONDS-T0)) s"
for tool in racecheck memcheck synccheck; do
  ( timeout 200 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 $B/tests/test_gpu_select > $OUT/san-$tool.log 2>&1; echo "sanitize $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-$tool.log | head -1)" ) &
done
wait
grep -vE "Host Frame|^=========\s*$" $OUT/san-racecheck.log | head -8
echo "at $((SECONDS-T0)) s"
for S in 8 3; do DPSAMPLING_SELECT_SPLIT=$S timeout 100 $B/tests/test_gpu_select > $OUT/select-$S.log 2>&1; echo "test_gpu_select split=$S rc=$?"; done
timeout 120 $B/tests/test_gpu_virtual_ranks scenario=select > $OUT/vr-select.log 2>&1; echo "vr select rc=$?"; grep -E "total|FAIL" $OUT/vr-select.log | head -5
{ echo "# command: $B/tools/dps-perf -t 1 -b onesided,nccl -o argmax,argmax_lse,topk -r 20 --csv"; timeout 120 $B/tools/dps-perf -t 1 -b onesided,nccl -o argmax,argmax_lse,topk -r 20 --csv; } > $OUT/perf-select.csv 2>&1; echo "perf rc=$?"; grep -E "^(argmax|topk|argmax_lse),|HBM|PASSED|FAILED" $OUT/perf-select.csv | cut -d, -f1-8 | paste -sd' '
timeout 100 ctest --test-dir $B -R "select|graph|teardown" > $OUT/ctest.log 2>&1; echo "ctest subset rc=$?"; grep -E "tests passed" $OUT/ctest.log
echo "total $((SECONDS-T0)) s"
