#!/usr/bin/env bash
# Session 37: one call, carry build-carry/s37/all.tar.xz (local, ignored). Binaries built on the
# CPU machine: cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
# -DDPS_BUILD_PYTHON=OFF -DDPS_WERROR=ON (test binaries hold the library statically).
#  new37/  test_gpu_sample, test_gpu_virtual_ranks, test_gpu_verify of branch s37-land (s36-huge,
#          then the logprob's log-sum taken relative to the maximum before the log)
#  base/, s36/, s37/  libdpsampling.so of main (78472ce), s36-huge (eb1fcb6), s37-land; dps-perf
#  (main's). s36-huge's test_gpu_sample is this fix's planted build: session 37's first call ran
#  it (bench/results/2026-12-05-h100-s36-ab.txt): 39 of 120 fp32 rows of masks wrong.
source "$(dirname "$0")/../device_env.sh"
C=/tmp/c37; rm -rf $C; mkdir -p $C; tar -xJf build-carry/s37/all.tar.xz -C $C
t "test_gpu_sample (s37)"; $C/new37/test_gpu_sample > $OUT/sample.log 2>&1; echo "rc=$?"
grep -E "passed \(|PASS|FAIL|differ|wrong|beyond|all -inf" $OUT/sample.log | head -16 | cut -c1-260
t "vr all"; timeout 250 $C/new37/test_gpu_virtual_ranks > $OUT/vr_all.log 2>&1; echo "rc=$?"
grep -E "total|FAIL|note" $OUT/vr_all.log | head -8
t "verify"; $C/new37/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -1 $OUT/verify.log
OPS=sample_t,sample_t_lp,sample_minp,sample_kp,sample_p,sample_p_flat
n=0
for lib in base s36 s37 s37 s36 base; do
  [ $((SECONDS-T0)) -gt ${DEADLINE:-400} ] && { t "A/B stopped (time)"; break; }
  n=$((n+1)); f=$OUT/perf_${n}_$lib.txt
  t "perf $lib"; LD_LIBRARY_PATH=$C/$lib:$LD_LIBRARY_PATH $C/dps-perf -t 1 -b onesided --no-peak \
    --no-check -o $OPS -s 64x1x152064,1024x1x152064 > $f 2>&1
  grep -hE "^ +sample_" $f | sed "s/^/$lib /" | cut -c1-110
done
t end
