#!/usr/bin/env bash
# Next device session, run A: checks of branch s31-fine-round on carried binaries (build-carry/r3/checks.tar.xz;
# the test binaries hold the s31 library statically), then the planted fault (every tie quota marked whole).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
T0=$SECONDS
NR=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
CU=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
mkdir -p /tmp/f && tar -xJf build-carry/r3/checks.tar.xz -C /tmp/f; ls /tmp/f; echo "untar [t=$((SECONDS-T0))s]"
L=$NR/lib:$CU
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $OUT/smi.txt 2>&1
run() { # name timeout env... -- cmd...
  local n=$1 to=$2; shift 2
  env LD_LIBRARY_PATH=$L "$@" > $OUT/$n.log 2>&1 </dev/null & local p=$!
  ( sleep $to; kill -9 $p 2>/dev/null ) & local w=$!
  wait $p; local rc=$?; kill $w 2>/dev/null
  echo "$n exit $rc [t=$((SECONDS-T0))s]"; tail -2 $OUT/$n.log
}
run sample 200 /tmp/f/test_gpu_sample
run sample_exact_local 150 DPSAMPLING_EXACT_SPLIT=0 DPS_SAMPLE_CHI2_SCALE=0.3 /tmp/f/test_gpu_sample onesided
run verify 100 /tmp/f/test_gpu_verify all
run vr 200 /tmp/f/test_gpu_virtual_ranks
run select 60 /tmp/f/test_gpu_select
run rng 30 /tmp/f/test_gpu_sample_rng
echo "planted (every part's tie quota whole: these must FAIL)"
run plant_sample 120 DPS_SAMPLE_CHI2_SCALE=0.3 /tmp/f/plant/test_gpu_sample onesided
run plant_vr 120 /tmp/f/plant/test_gpu_virtual_ranks scenario=sample
echo "[t=$((SECONDS-T0))s] end"
