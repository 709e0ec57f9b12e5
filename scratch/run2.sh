#!/usr/bin/env bash
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
timeout 120 $B/tests/test_gpu_select > $OUT/select.log 2>&1; echo "test_gpu_select rc=$?"; grep -E "cases passed" $OUT/select.log
timeout 120 $B/tests/test_gpu_virtual_ranks scenario=select > $OUT/vr-select.log 2>&1; echo "vr select rc=$?"; grep -E "total" $OUT/vr-select.log
PYTHONPATH=$B/python timeout 150 python3 -m pytest -q python/tests/test_select.py > $OUT/pytest-select.log 2>&1; echo "pytest select rc=$?"; tail -2 $OUT/pytest-select.log
timeout 150 $B/tools/dps-perf -t 1 -b onesided -o argmax,argmax_lse,topk > $OUT/perf-select.log 2>&1; echo "perf rc=$?"; grep -E "HBM|^ +(argmax|topk)" $OUT/perf-select.log
PYTHONPATH=$B/python timeout 100 python3 bench/compare_torch.py --world 1 --ops argmax,topk --backends onesided > $OUT/compare-select.log 2>&1; echo "compare rc=$?"; grep -E "^ +(argmax|topk)|wrong" $OUT/compare-select.log
# the C example, the Python example, the wheel in torch's environment + the spec suite from it
timeout 60 $B/dps_example 1 > $OUT/example-c.log 2>&1; echo "dps_example 1 rc=$?"; tail -2 $OUT/example-c.log
(timeout 60 torchrun --nproc-per-node 1 examples/python/dps_example.py > $OUT/example-py.log 2>&1; echo "python example rc=$?"; tail -2 $OUT/example-py.log)
W=/tmp/dps-wheel; rm -rf $W; (timeout 150 python3 -m pip install -q --no-build-isolation --no-deps --target $W . > $OUT/wheel.log 2>&1; echo "pip install rc=$?")
R=$PWD; (cd /tmp && PYTHONPATH=$W timeout 200 python3 -m pytest -q $R/python/tests/test_spec.py $R/python/tests/test_teardown.py > $OUT/pytest-from-wheel.log 2>&1; echo "pytest from the installed package rc=$?"; tail -2 $OUT/pytest-from-wheel.log; PYTHONPATH=$W python3 -c "import dpsampling; print('installed:', dpsampling.__file__, dpsampling.__version__)")
timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $B/tests/test_gpu_virtual_ranks tp=8 small scenario=shapes,select > $OUT/san-memcheck-vr8.log 2>&1; echo "memcheck vr tp=8 rc=$?"; grep -E "ERROR SUMMARY|^tp=|total" $OUT/san-memcheck-vr8.log | tail -4
