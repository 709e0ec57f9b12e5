#!/usr/bin/env bash
# device run: build, selection tests, benchmark, then the whole one-GPU suite (logs under $OUT)
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
echo "build done at $((SECONDS-T0)) s"
timeout 120 $B/tests/test_gpu_select > $OUT/select.log 2>&1; echo "test_gpu_select rc=$?"; tail -3 $OUT/select.log
timeout 120 $B/tests/test_gpu_virtual_ranks scenario=select > $OUT/vr-select.log 2>&1; echo "vr select rc=$?"; grep -E "^tp=|total|FAIL" $OUT/vr-select.log | head -20
timeout 100 $B/tools/dps-perf -t 1 -b onesided -o argmax,argmax_lse,topk -r 20 > $OUT/perf-select.log 2>&1; echo "perf rc=$?"; grep -E "HBM|^ +(argmax|topk|argmax_lse) |PASSED|FAILED" $OUT/perf-select.log
echo "at $((SECONDS-T0)) s"
timeout 150 ctest --test-dir $B --output-on-failure -E "test_gpu_virtual_ranks|test_gpu_select" > $OUT/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Failed|\(Failed\)" $OUT/ctest.log
timeout 100 $B/tests/test_gpu_virtual_ranks > $OUT/vr.log 2>&1; echo "vr rc=$?"; grep -E "^tp=|total" $OUT/vr.log
echo "at $((SECONDS-T0)) s"
PYTHONPATH=$B/python timeout 120 python3 -m pytest -q -rs python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?"; grep -E "passed|failed" $OUT/pytest.log | tail -3
echo "total $((SECONDS-T0)) s"
