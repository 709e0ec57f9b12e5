#!/usr/bin/env bash
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
echo "build done at $((SECONDS-T0)) s"
timeout 60 $B/tests/test_gpu_select > $OUT/select.log 2>&1; echo "test_gpu_select rc=$?"; grep -E "PASS|FAIL" $OUT/select.log | head -3
timeout 60 $B/tests/test_gpu_virtual_ranks scenario=select > $OUT/vr-select.log 2>&1; echo "vr select rc=$?"; grep -E "total" $OUT/vr-select.log
{ echo "# command: $B/tools/dps-perf -t 1 -b onesided -o argmax,argmax_lse,topk -s 8x1x64640,64x1x76032,128x1x76032,256x1x76032,512x1x76032,1024x1x76032 -r 20 --csv"; timeout 60 $B/tools/dps-perf -t 1 -b onesided -o argmax,argmax_lse,topk -s 8x1x64640,64x1x76032,128x1x76032,256x1x76032,512x1x76032,1024x1x76032 -r 20 --csv; } > $OUT/perf-select.csv 2>&1; echo "perf rc=$?"; grep -E "^(argmax|topk|argmax_lse),|HBM|PASSED|FAILED" $OUT/perf-select.csv | cut -d, -f1,3,8 | paste -sd' '
timeout 60 ctest --test-dir $B -R "select|graph" > $OUT/ctest.log 2>&1; echo "ctest subset rc=$?"; grep -E "tests passed" $OUT/ctest.log
echo "total $((SECONDS-T0)) s"
