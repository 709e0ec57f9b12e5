#!/usr/bin/env bash
# Session 36: one call, carry build-carry/s36/all.tar.xz (local, ignored). Binaries built on the
# CPU machine: cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
# -DDPS_BUILD_PYTHON=OFF -DDPS_WERROR=ON (test binaries hold the library statically).
#  new36/   test_gpu_sample, test_gpu_virtual_ranks, test_gpu_verify of branch s36-huge (s35-neginf
#           rebased on main, then the fix of scores beyond 2.3e7 and its test)
#  plant36/ test_gpu_sample: s36-huge's tests over s35-neginf's kernels (the fix of scores beyond
#           2.3e7 undone): must FAIL
#  plantA/, plantB/  session 35's planted builds (raceFlush drops -inf keys; decide does not skip
#           top-p for a -inf largest score): each must FAIL
#  base/, s35/, s36/  libdpsampling.so of main (78472ce), s35-neginf, s36-huge; dps-perf (main's)
source "$(dirname "$0")/../device_env.sh"
C=/tmp/c36; rm -rf $C; mkdir -p $C; tar -xJf build-carry/s36/all.tar.xz -C $C
t "test_gpu_sample (s36)"; $C/new36/test_gpu_sample > $OUT/sample.log 2>&1; echo "rc=$?"
grep -E "passed \(|FAIL|differ|wrong|beyond|all -inf" $OUT/sample.log | head -16 | cut -c1-260
if [ -n "${MIN:-}" ]; then # the least that lands it: the sample tests, the new plant, vr's sample scenario
  t "planted plant36 (must fail)"; $C/plant36/test_gpu_sample onesided > $OUT/plant36.log 2>&1; echo "rc=$?"
  grep -E "passed \(|FAIL|differ|wrong" $OUT/plant36.log | head -4 | cut -c1-260
  t "vr sample"; DPS_VR_SCENARIO=sample timeout 150 $C/new36/test_gpu_virtual_ranks > $OUT/vr_sample.log 2>&1; echo "rc=$?"
  grep -E "total|FAIL|note" $OUT/vr_sample.log | head -8
  t "verify"; $C/new36/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -1 $OUT/verify.log
  t end; exit 0
fi
t "vr all"; timeout 250 $C/new36/test_gpu_virtual_ranks > $OUT/vr_all.log 2>&1; echo "rc=$?"
grep -E "total|FAIL|note" $OUT/vr_all.log | head -8
t "verify"; $C/new36/test_gpu_verify all > $OUT/verify.log 2>&1; echo "rc=$?"; tail -1 $OUT/verify.log
for p in plant36 plantA plantB; do
  [ $p != plant36 ] && [ $((SECONDS-T0)) -gt ${DEADLINE:-470} ] && { t "$p skipped (time)"; continue; }
  t "planted $p (must fail)"; $C/$p/test_gpu_sample onesided > $OUT/$p.log 2>&1; echo "rc=$?"
  grep -E "passed \(|FAIL|differ|wrong" $OUT/$p.log | head -4 | cut -c1-260
done
OPS=sample_t,sample_t_lp,sample_minp,sample_kp,sample_p,sample_p_flat
n=0
for lib in base s35 s36 s36 s35 base; do
  [ $((SECONDS-T0)) -gt ${DEADLINE:-470} ] && { t "A/B stopped (time)"; break; }
  n=$((n+1)); f=$OUT/perf_${n}_$lib.txt
  t "perf $lib"; LD_LIBRARY_PATH=$C/$lib:$LD_LIBRARY_PATH $C/dps-perf -t 1 -b onesided --no-peak \
    --no-check -o $OPS -s 64x1x152064,1024x1x152064 > $f 2>&1
  grep -hE "^ +sample_" $f | sed "s/^/$lib /" | cut -c1-110
done
t end
