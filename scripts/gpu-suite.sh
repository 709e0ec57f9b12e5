#!/usr/bin/env bash
# The whole multi-GPU run on a GPU machine, in stages (default: all):
#   build   configure + build against the NCCL inside torch's environment
#   ctest   every C test (CPU + multi-GPU)
#   perf    dps-perf default run
#   python  the Python tests, spec included
#   compare bench/compare_torch.py
#   sanitize the multi-GPU C tests at small sizes under compute-sanitizer
#   latency  dps-perf, onesided, small shapes, with and without PDL
#   reliability  test_gpu_reliability with the issue's figures
#            (DPS_RELIABILITY_CYCLES=1000, DPS_SOAK_REPLAYS=100000 unless set)
# Env: CTEST_ARGS (extra ctest arguments, e.g. -E test_gpu_reliability),
#      PERF_ARGS (extra dps-perf arguments), SAN_TESTS, SAN_TOOLS.
# Logs (at most 8 files) go to $LOGDIR (default: $OUT if set, else ./gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
LOGDIR=${LOGDIR:-${OUT:-gpu-logs}}
mkdir -p "$LOGDIR"
BUILD=${BUILD:-build-gpu}
stages=${*:-build ctest perf python compare}
NCCL_ROOT=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
rc=0
for st in $stages; do
  echo "=== stage $st ($(date +%T))"
  case $st in
    build)
      make build BUILD=$BUILD CMAKE_ARGS="${NCCL_ROOT:+-DDPS_NCCL_ROOT=$NCCL_ROOT}" \
        >"$LOGDIR/build.log" 2>&1 || { rc=1; tail -40 "$LOGDIR/build.log"; break; } ;;
    ctest)
      ctest --test-dir $BUILD --output-on-failure ${CTEST_ARGS:-} 2>&1 | tee "$LOGDIR/ctest.log" || rc=1 ;;
    perf)
      $BUILD/tools/dps-perf ${PERF_ARGS:-} 2>&1 | tee "$LOGDIR/perf.log" || rc=1 ;;
    latency)
      small=8x1x64,8x4,8x8,64x1,64x4,64x8,256x1,256x4,256x8,512x1,512x4,512x8
      for pdl in 1 0; do
        echo "--- DPSAMPLING_PDL=$pdl"
        DPSAMPLING_PDL=$pdl $BUILD/tools/dps-perf -b onesided --no-peak -s $small -r 50 2>&1 || rc=1
      done | tee "$LOGDIR/latency.log" ;;
    reliability)
      DPS_RELIABILITY_CYCLES=${DPS_RELIABILITY_CYCLES:-1000} DPS_SOAK_REPLAYS=${DPS_SOAK_REPLAYS:-100000} \
        $BUILD/tests/test_gpu_reliability 2>&1 | tee "$LOGDIR/reliability.log" || rc=1 ;;
    python)
      make test-python BUILD=$BUILD 2>&1 | tee "$LOGDIR/pytest.log" | grep -E "PASS|FAIL|SKIP|ERROR|passed|failed" || rc=1 ;;
    compare)
      PYTHONPATH=$PWD/$BUILD/python python3 bench/compare_torch.py 2>&1 | tee "$LOGDIR/compare.log" || rc=1 ;;
    sanitize)
      # NCCL probes CUDA APIs that fail by design (cuMemCreate with fabric
      # handles, kernels not built for this arch): report kernel errors only.
      for t in ${SAN_TESTS:-$BUILD/tests/test_gpu_*}; do
        for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
          echo "--- $tool $t"
          DPS_TEST_SMALL=1 compute-sanitizer --tool $tool --report-api-errors no --target-processes all --error-exitcode 9 \
            $t >/tmp/san.log 2>&1; r=$?
          cat /tmp/san.log >>"$LOGDIR/sanitize.log"; tail -3 /tmp/san.log; [ $r -eq 0 ] || rc=1
        done
      done ;;
    *) echo "unknown stage $st"; rc=1 ;;
  esac
done
echo "=== done rc=$rc ($(date +%T))"
exit $rc
