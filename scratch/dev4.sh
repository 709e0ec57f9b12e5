#!/usr/bin/env bash
# device run: build + dpsSample tests (tp=1, virtual ranks, python) + select regressions
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS
el() { echo "[t=$((SECONDS-T0))s] $*"; }
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
PY=$(command -v python3)
el build
( cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90 -DDPS_NCCL_ROOT=$NR -DDPS_BUILD_PYTHON=ON -DPython3_EXECUTABLE=$PY -DDPS_WERROR=ON && cmake --build build-gpu -j16 ) > $OUT/build-gpu.log 2>&1 || { tail -30 $OUT/build-gpu.log; exit 1; }
el built
timeout ${T_SAMPLE:-240} build-gpu/tests/test_gpu_sample > $OUT/test_gpu_sample.log 2>&1; echo "test_gpu_sample exit $?"; grep -E "FAIL|fail|error|PASS|pass|ok " $OUT/test_gpu_sample.log | head -40; tail -15 $OUT/test_gpu_sample.log
el vr
timeout ${T_VR:-150} build-gpu/tests/test_gpu_virtual_ranks scenario=sample,select > $OUT/vr.log 2>&1; echo "vr exit $?"; grep -iE "fail|error|mismatch" $OUT/vr.log | head -20; tail -12 $OUT/vr.log
el pytest
PYTHONPATH=build-gpu/python timeout ${T_PY:-200} python3 -m pytest -x -q python/tests/test_sample.py > $OUT/pytest_sample.log 2>&1; echo "pytest exit $?"; tail -25 $OUT/pytest_sample.log
el select
timeout 100 build-gpu/tests/test_gpu_select > $OUT/select.log 2>&1; echo "select exit $?"; tail -3 $OUT/select.log
el done
el perf
timeout ${T_PERF:-200} build-gpu/tools/dps-perf -t 1 -b onesided -o ${PERF_OPS:-sample} > $OUT/perf_sample.log 2>&1; echo "perf exit $?"; cat $OUT/perf_sample.log | cut -c1-220 | tail -80
el done2
