#!/usr/bin/env bash
# device run: build, the selection tests, the selection benchmarks (logs under $OUT)
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
timeout 150 $B/tests/test_gpu_select > $OUT/select.log 2>&1; echo "test_gpu_select rc=$?"; grep -E "cases passed|PASS|FAIL|wrong" $OUT/select.log | head -8
timeout 150 $B/tests/test_gpu_virtual_ranks scenario=select > $OUT/vr-select.log 2>&1; echo "vr select rc=$?"; grep -E "^tp=|total" $OUT/vr-select.log
PYTHONPATH=$B/python timeout 150 python3 -m pytest -q -x python/tests/test_select.py > $OUT/pytest-select.log 2>&1; echo "pytest select rc=$?"; tail -3 $OUT/pytest-select.log
timeout 120 $B/tools/dps-perf -t 1 -b onesided -o argmax,topk > $OUT/perf-select.log 2>&1; echo "perf rc=$?"; grep -vE "^#   " $OUT/perf-select.log | tail -14
PYTHONPATH=$B/python timeout 120 python3 bench/compare_torch.py --world 1 --ops argmax,topk --backends onesided > $OUT/compare-select.log 2>&1; echo "compare rc=$?"; tail -12 $OUT/compare-select.log
