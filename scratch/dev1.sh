#!/usr/bin/env bash
# device run 1: builds (torch NCCL, system NCCL, negative control), tests
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS
el() { echo "[t=$((SECONDS-T0))s] $*"; }
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
PY=$(command -v python3)
rm -rf /tmp/neg && mkdir -p /tmp/neg && tar cf - --exclude='./build*' . | tar xf - -C /tmp/neg
sed -i 's/  if (st->tp == 1) return dpsSuccess;/  if (st->tp <= 2) return dpsSuccess; \/\* NEGATIVE CONTROL \*\//' /tmp/neg/src/backends/onesided_backend.c
grep -n "NEGATIVE CONTROL" /tmp/neg/src/backends/onesided_backend.c
el builds
( cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90 -DDPS_NCCL_ROOT=$NR -DDPS_BUILD_PYTHON=ON -DPython3_EXECUTABLE=$PY -DDPS_WERROR=ON && cmake --build build-gpu -j10 ) > $OUT/build-gpu.log 2>&1 &
( cmake -S . -B build-sys -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build-sys -j3 --target test_gpu_select test_gpu_symmetric ) > $OUT/build-sys.log 2>&1 &
( cd /tmp/neg && cmake -S . -B b -DCMAKE_CUDA_ARCHITECTURES=90 -DDPS_NCCL_ROOT=$NR && cmake --build b -j3 --target test_gpu_virtual_ranks ) > $OUT/build-neg.log 2>&1 &
wait
tail -3 $OUT/build-gpu.log $OUT/build-sys.log $OUT/build-neg.log
grep -h "NCCL" $OUT/build-sys.log | head -3
el ctest
{
timeout 240 ctest --test-dir build-gpu --output-on-failure -E test_gpu_virtual_ranks 2>&1 | tail -60
el sys-symmetric
for e in "" NCCL_CUMEM_ENABLE=0 NCCL_WIN_ENABLE=0; do echo "--- system NCCL, env: ${e:-none}"; env -u NCCL_CUMEM_ENABLE -u NCCL_WIN_ENABLE $e timeout 60 build-sys/tests/test_gpu_symmetric; echo "exit $?"; done
el vr-reduced
timeout 150 build-gpu/tests/test_gpu_virtual_ranks 2>&1 | tail -40
el negative-control
timeout 60 /tmp/neg/b/tests/test_gpu_virtual_ranks tp=2 backend=onesided scenario=select 2>&1 | tail -8
el connections-1
DPS_VR_CONNECTIONS=1 timeout 60 build-gpu/tests/test_gpu_virtual_ranks tp=8 backend=onesided scenario=shapes 2>&1 | tail -8
} > $OUT/tests.log 2>&1
el "pytest + memcheck (parallel)"
( PYTHONPATH=build-gpu/python timeout 240 python3 -m pytest -q -rs python/tests > $OUT/pytest.log 2>&1; echo "pytest exit $?" >> $OUT/pytest.log ) &
for b in build-gpu build-sys; do for e in "" NCCL_CUMEM_ENABLE=0; do
 ( echo "--- memcheck $b ${e:-}"; env $e DPS_TEST_SMALL=1 timeout 240 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $b/tests/test_gpu_select > /tmp/mc-$b-${e:-none}.log 2>&1; echo "exit $?"; grep -E "PASS|FAIL|SKIP|unavailable|ERROR SUMMARY|Invalid|cases" /tmp/mc-$b-${e:-none}.log | head -12 ) > /tmp/mcs-$b-${e:-none}.txt &
done; done
wait
cat /tmp/mcs-*.txt > $OUT/memcheck.log
el done
grep -E "tests passed|tests failed|Failed|PASS|FAIL|passed,|exit" $OUT/tests.log | head -60
tail -5 $OUT/pytest.log
cat $OUT/memcheck.log
