#!/usr/bin/env bash
set -uo pipefail
export CUDAARCHS=90 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=build-gpu; T0=$SECONDS
scripts/gpu-suite.sh build > $OUT/build-stage.log 2>&1 || { tail -30 $OUT/build-stage.log; exit 1; }
timeout 150 ctest --test-dir $B --output-on-failure -E test_gpu_virtual_ranks > $OUT/ctest.log 2>&1; echo "ctest rc=$?"; grep -E "tests passed|\(Failed\)|exported_symbols:" $OUT/ctest.log
timeout 90 $B/tests/test_gpu_virtual_ranks > $OUT/vr.log 2>&1; echo "vr rc=$?"; grep -E "total" $OUT/vr.log
PYTHONPATH=$B/python timeout 90 python3 -m pytest -q python/tests/test_select.py python/tests/test_teardown.py python/tests/test_cpu.py > $OUT/pytest.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/pytest.log
nm -D --defined-only $B/libdpsampling.so | wc -l
echo "total $((SECONDS-T0)) s"
