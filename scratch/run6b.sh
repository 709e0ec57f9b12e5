#!/usr/bin/env bash
# device run: build, selection tests, split sweep, benchmark, suite, example (logs under $OUT)
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
echo "build done at $((SECONDS-T0)) s"
timeout 120 $B/tests/test_gpu_select > $OUT/select.log 2>&1; echo "test_gpu_select rc=$?"; tail -1 $OUT/select.log
timeout 120 $B/tests/test_gpu_virtual_ranks scenario=select > $OUT/vr-select.log 2>&1; echo "vr select rc=$?"; grep -E "total|FAIL" $OUT/vr-select.log | head -5
DPSAMPLING_DEBUG=INFO timeout 60 $B/tools/dps-perf -t 1 -b onesided -o argmax -s 8x1x64640 -r 2 2>&1 | grep -E "rows per wave" | head -2
for S in 1 2 3 4 6 8; do
  echo "split=$S"
  DPSAMPLING_SELECT_SPLIT=$S timeout 60 $B/tools/dps-perf -t 1 -b onesided -o argmax,topk -s 8x1x64640,64x1x76032,256x1x76032 -r 20 > $OUT/sweep-$S.log 2>&1; grep -E "^ +(argmax|topk) " $OUT/sweep-$S.log | awk '{print $1, $3"x"$5, $8}' | paste -sd' '
done
timeout 100 $B/tools/dps-perf -t 1 -b onesided -o argmax,argmax_lse,topk -r 20 > $OUT/perf-select.log 2>&1; echo "perf rc=$?"; grep -E "HBM|^ +(argmax|topk|argmax_lse) |PASSED|FAILED" $OUT/perf-select.log
echo "at $((SECONDS-T0)) s"
timeout 100 $B/tests/test_gpu_virtual_ranks > $OUT/vr.log 2>&1; echo "vr rc=$?"; grep -E "total" $OUT/vr.log
PYTHONPATH=$B/python timeout 100 python3 -m pytest -q -rs python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?"; grep -E "passed|failed" $OUT/pytest.log | tail -2
PYTHONPATH=$B/python timeout 100 torchrun --nproc-per-node 1 examples/python/dps_example.py > $OUT/example.log 2>&1; echo "example rc=$?"; tail -5 $OUT/example.log
PYTHONPATH=$B/python timeout 120 python3 bench/compare_torch.py --world 1 --ops argmax,topk --backends onesided,nccl > $OUT/compare-select.log 2>&1; echo "compare rc=$?"; grep -vE "^#" $OUT/compare-select.log | tail -14
echo "total $((SECONDS-T0)) s"
