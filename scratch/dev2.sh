#!/usr/bin/env bash
# device run 2: rebuild, fixed tests, full virtual-rank matrix (tp 2..7 once, tp=8 repeatedly)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS
el() { echo "[t=$((SECONDS-T0))s] $*"; }
LIMIT=${LIMIT:-540}
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
PY=$(command -v python3)
el builds
( cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90 -DDPS_NCCL_ROOT=$NR -DDPS_BUILD_PYTHON=ON -DPython3_EXECUTABLE=$PY -DDPS_WERROR=ON && cmake --build build-gpu -j12 ) > $OUT/build2-gpu.log 2>&1 &
( cmake -S . -B build-sys -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build-sys -j4 --target test_gpu_symmetric ) > $OUT/build2-sys.log 2>&1 &
wait; tail -2 $OUT/build2-gpu.log $OUT/build2-sys.log
{
el symmetric
for b in build-gpu build-sys; do for e in "" NCCL_CUMEM_ENABLE=0 NCCL_WIN_ENABLE=0; do echo "--- $b env: ${e:-none}"; env -u NCCL_CUMEM_ENABLE -u NCCL_WIN_ENABLE $e timeout 60 $b/tests/test_gpu_symmetric 2>&1 | grep -E "symmetric memory|backend=|PASS|FAIL|CHECK"; done; done
PYTHONPATH=build-gpu/python timeout 120 python3 -m pytest -q python/tests/test_symmetric.py 2>&1 | tail -2
el example
PYTHONPATH=$PWD/build-gpu/python timeout 120 torchrun --nproc-per-node 1 examples/python/dps_example.py 2>&1 | tail -3
} > $OUT/run2-tests.log 2>&1
el vr-full-tp8-first
DPS_VR_FULL=1 DPS_VR_WATCHDOG_S=500 timeout 520 build-gpu/tests/test_gpu_virtual_ranks tp=8 > $OUT/vr-tp8-1.log 2>&1; echo "exit $?" >> $OUT/vr-tp8-1.log
tail -4 $OUT/vr-tp8-1.log
el vr-full-tp2-7
DPS_VR_FULL=1 DPS_VR_WATCHDOG_S=500 timeout $((LIMIT - (SECONDS-T0))) build-gpu/tests/test_gpu_virtual_ranks tp=2-7 > $OUT/vr-tp2-7.log 2>&1; echo "exit $?" >> $OUT/vr-tp2-7.log
grep -E "^tp=|total|FAIL|exit" $OUT/vr-tp2-7.log | tail -20
el done
cat $OUT/run2-tests.log
