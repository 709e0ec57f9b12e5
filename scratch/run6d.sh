#!/usr/bin/env bash
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
echo "build done at $((SECONDS-T0)) s"
for tool in memcheck racecheck synccheck; do
  ( timeout 200 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 $B/tests/test_gpu_select > $OUT/san-$tool.log 2>&1; echo "sanitize $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-$tool.log | head -1)" ) &
done
wait
echo "at $((SECONDS-T0)) s"
{ echo "# commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"; echo "# command: $B/tools/dps-perf -t 1 -b onesided,nccl -o argmax,argmax_lse,topk -r 20 --csv"; timeout 120 $B/tools/dps-perf -t 1 -b onesided,nccl -o argmax,argmax_lse,topk -r 20 --csv; } > $OUT/perf-select.csv 2>&1; echo "perf rc=$?"; grep -E "^(argmax|topk|argmax_lse),|HBM|PASSED|FAILED" $OUT/perf-select.csv | cut -d, -f1-8
PYTHONPATH=$B/python timeout 120 python3 bench/compare_torch.py --world 1 --ops argmax,topk --backends onesided,nccl > $OUT/compare-select.log 2>&1; echo "compare rc=$?"; grep -vE "^#" $OUT/compare-select.log | tail -12
echo "at $((SECONDS-T0)) s"
DPS_VR_FULL=1 timeout 200 $B/tests/test_gpu_virtual_ranks > $OUT/vr-full.log 2>&1; echo "vr full rc=$?"; grep -E "^tp=|total" $OUT/vr-full.log | tail -16
echo "total $((SECONDS-T0)) s"
