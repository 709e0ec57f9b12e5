#!/usr/bin/env bash
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90 -DDPS_NCCL_ROOT=$NR -DDPS_WERROR=ON -DDPS_BUILD_PYTHON=OFF > $OUT/build3.log 2>&1 && cmake --build build-gpu -j16 >> $OUT/build3.log 2>&1 || { tail -20 $OUT/build3.log; exit 1; }
echo "[t=$((SECONDS-T0))s] built $(git rev-parse --short HEAD 2>/dev/null)"
timeout 150 ctest --test-dir build-gpu --output-on-failure > $OUT/ctest3.log 2>&1; echo "ctest exit $?"
grep -E "tests passed|tests failed|Failed|\(Failed\)|Timeout" $OUT/ctest3.log | head
grep -E "total|PASS|FAIL|equal|differ" $OUT/ctest3.log | grep -iE "sample_rng|virtual|symmetric" | head
timeout 40 build-gpu/tests/test_gpu_sample_rng 2>&1 | tail -6
echo "[t=$((SECONDS-T0))s] done"
