#!/usr/bin/env bash
# The whole multi-GPU run on a GPU machine, in stages (default: all):
#   build   configure + build against the NCCL inside torch's environment
#   ctest   every C test (CPU + multi-GPU)
#   perf    dps-perf default run
#   python  the Python tests, spec included
#   compare bench/compare_torch.py
#   sanitize the multi-GPU C tests at small sizes under compute-sanitizer
#   latency  dps-perf, onesided, small shapes: defaults, PDL off, LL128 gathers
#   reliability  test_gpu_reliability with the issue's figures
#            (DPS_RELIABILITY_CYCLES=1000, DPS_SOAK_REPLAYS=100000 unless set)
# Env: CTEST_ARGS (extra ctest arguments, e.g. -E test_gpu_reliability),
#      PERF_ARGS (extra dps-perf arguments), LAT_VARIANTS (latency stage:
#      variants, each "VAR=v[,VAR=v...]" or "-" for the defaults; the older
#      "PDL,THREADS" pairs are gone), SAN_TESTS (default: every
#      test_gpu_* but test_gpu_virtual_ranks, which runs as two entries at
#      tp=8, one per backend), SAN_TOOLS,
#      SAN_LANE_TIMEOUT (seconds per sanitized test), SAN_LANE_DEADLINE (no new
#      test starts in a tool's lane after that many seconds).
# Logs (at most 8 files; sanitize writes one per tool) go to $LOGDIR (default: $OUT if set, else ./gpu-logs).
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
      # onesided small shapes; one dps-perf run per variant (comma-separated
      # environment assignments; "-" = defaults)
      small=8x1x64,8x4,8x8,64x1,64x4,64x8,256x1,256x4,256x8,512x1,512x4,512x8
      for v in ${LAT_VARIANTS:-- DPSAMPLING_PDL=0 DPSAMPLING_ONESIDED_GATHER_PROTO=ll128}; do
        [ "$v" = - ] && v=""
        echo "--- variant: ${v:-defaults}"
        env ${v//,/ } $BUILD/tools/dps-perf -b onesided --no-peak -s $small -r 50 2>&1 || echo "dps-perf failed"
      done | tee "$LOGDIR/latency.log"
      grep -q "dps-perf failed" "$LOGDIR/latency.log" && rc=1 ;;
    reliability)
      DPS_RELIABILITY_CYCLES=${DPS_RELIABILITY_CYCLES:-1000} DPS_SOAK_REPLAYS=${DPS_SOAK_REPLAYS:-100000} \
        $BUILD/tests/test_gpu_reliability 2>&1 | tee "$LOGDIR/reliability.log" || rc=1 ;;
    python)
      make test-python BUILD=$BUILD 2>&1 | tee "$LOGDIR/pytest.log" | grep -E "PASS|FAIL|SKIP|ERROR|passed|failed" || rc=1 ;;
    compare)
      PYTHONPATH=$PWD/$BUILD/python python3 bench/compare_torch.py 2>&1 | tee "$LOGDIR/compare.log" || rc=1 ;;
    sanitize)
      # One lane per tool, in parallel; each lane runs the tests in turn.
      # NCCL probes CUDA APIs that fail by design (cuMemCreate with fabric
      # handles, kernels not built for this arch): report kernel errors only.
      # SAN_TESTS entries are "[VAR=v[,VAR=v...]@]binary[:argument]".
      # The virtual-rank test runs at tp=8 only (small shapes: DPS_TEST_SMALL).
      san_default=""
      for b in $BUILD/tests/test_gpu_*; do
        [ "${b##*/}" = test_gpu_virtual_ranks ] || san_default="$san_default $b"
      done
      vr=$BUILD/tests/test_gpu_virtual_ranks
      # Not the onesided virtual ranks: their kernels poll for each other on
      # one GPU, and compute-sanitizer does not run them concurrently (seen:
      # memcheck 0 errors, but every onesided case ends in its timeout).
      san_default="$san_default DPS_VR_BACKEND=nccl@$vr:tp=8"
      for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
        (
          lrc=0; start=$SECONDS
          for t in ${SAN_TESTS:-$san_default}; do
            envs=""; [ "${t#*@}" != "$t" ] && { envs=${t%%@*}; t=${t#*@}; }
            bin=${t%%:*}; arg=""; [ "$bin" != "$t" ] && arg=${t#*:}
            if [ $((SECONDS - start)) -ge ${SAN_LANE_DEADLINE:-100000} ]; then
              echo "--- $tool ${envs:+$envs }$bin $arg: not run (lane deadline ${SAN_LANE_DEADLINE}s)"; continue
            fi
            echo "--- $tool ${envs:+$envs }$bin $arg"
            env ${envs//,/ } DPS_TEST_SMALL=1 DPS_RELIABILITY_CYCLES=3 DPS_SOAK_REPLAYS=50 \
              timeout ${SAN_LANE_TIMEOUT:-900} compute-sanitizer --tool $tool --report-api-errors no \
              --target-processes all --error-exitcode 9 $bin $arg >/tmp/san-$tool.log 2>&1; r=$?
            cat /tmp/san-$tool.log; echo "--- $tool ${envs:+$envs }$bin $arg: exit $r"; [ $r -eq 0 ] || lrc=1
          done
          exit $lrc
        ) >"$LOGDIR/sanitize-$tool.log" 2>&1 &
      done
      for j in $(jobs -p); do wait $j || rc=1; done
      grep -h -E "^--- .*: (exit|not run)|ERROR SUMMARY|RACECHECK SUMMARY" "$LOGDIR"/sanitize-*.log ;;
    *) echo "unknown stage $st"; rc=1 ;;
  esac
done
echo "=== done rc=$rc ($(date +%T))"
exit $rc
