#!/usr/bin/env bash
# final device run: the whole one-GPU suite, the selection benchmark, sanitizers (logs under $OUT)
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
echo "build done at $((SECONDS-T0)) s"
timeout 200 ctest --test-dir $B --output-on-failure -E test_gpu_virtual_ranks > $OUT/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Failed|\(Failed\)" $OUT/ctest.log
timeout 120 $B/tests/test_gpu_virtual_ranks > $OUT/vr.log 2>&1; echo "vr rc=$?"; grep -E "^tp=|total" $OUT/vr.log
echo "at $((SECONDS-T0)) s"
PYTHONPATH=$B/python timeout 150 python3 -m pytest -q -s -rs python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?"; grep -E "cycles: free|passed|failed" $OUT/pytest.log | tail -4
echo "at $((SECONDS-T0)) s"
timeout 100 $B/tools/dps-perf -t 1 -b onesided -o argmax,argmax_lse,topk -r 20 > $OUT/perf-select.log 2>&1; echo "perf rc=$?"; grep -E "HBM|^ +(argmax|topk)|PASSED|FAILED" $OUT/perf-select.log
echo "at $((SECONDS-T0)) s"
SAN_TOOLS="memcheck racecheck synccheck" SAN_LANE_TIMEOUT=120 SAN_TESTS="DPS_VR_BACKEND=nccl@$B/tests/test_gpu_virtual_ranks:tp=8" \
  timeout 260 scripts/gpu-suite.sh sanitize > $OUT/sanitize.log 2>&1; echo "sanitize rc=$?"; grep -E "^--- .*: (exit|not run)|ERROR SUMMARY|RACECHECK SUMMARY" $OUT/sanitize*.log | cut -c1-200
echo "total $((SECONDS-T0)) s"
